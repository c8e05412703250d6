#!/bin/bash
# setwnd.sh POD BYTES : set cni_netns.ingress_wnd of the pod's netns (egress rate kept)
pod=$1 w=$2
cookie=$(ip netns exec $pod python3 -c 'import socket;s=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM);print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET,71,8),"little"))')
m=/sys/fs/bpf/bwp/maps_v1/cni_netns
hex() { python3 -c "import sys;print(' '.join(f'{b:02x}' for b in int(sys.argv[1]).to_bytes(int(sys.argv[2]),'little')))" $1 $2; }
er=$(bpftool -j map dump pinned $m | python3 -c 'import json,sys;print([e["formatted"]["value"]["egress_rate"] for e in json.load(sys.stdin) if e["formatted"]["key"]=='$cookie'][0])')
bpftool map update pinned $m key hex $(hex $cookie 8) value hex $(hex $er 8) 00 00 00 00 $(hex $w 4)
bpftool -j map dump pinned $m | python3 -c 'import json,sys;print([e["formatted"] for e in json.load(sys.stdin) if e["formatted"]["key"]=='$cookie'][0])'
