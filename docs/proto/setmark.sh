#!/bin/bash
# setmark.sh HOSTIF US : set bw_state.mark_us of the ingress bucket of a host veth
idx=$(ip -n bwp-node -j link show $1 | python3 -c 'import json,sys;print(json.load(sys.stdin)[0]["ifindex"])')
m=/sys/fs/bpf/bwp/maps_v1/cni_bandwidth
python3 - $idx $2 <<'PY'
import json, subprocess, sys
idx, us = int(sys.argv[1]), int(sys.argv[2])
d = json.loads(subprocess.run(["bpftool","-j","map","dump","pinned","/sys/fs/bpf/bwp/maps_v1/cni_bandwidth"],capture_output=True,text=True).stdout)
for e in d:
    k = e["formatted"]["key"]
    if k["ifindex"] == idx and k["dir"] == 1:
        v = e["formatted"]["value"]
        kb = idx.to_bytes(4,"little") + (1).to_bytes(4,"little")
        vb = (0).to_bytes(4,"little") + us.to_bytes(4,"little")
        for f, n, sg in (("ns_per_byte",8,False),("burst_ns",8,False),("tokens_ns",8,True),("last_ns",8,False),("rate_bps",8,False),("burst_bits",8,False)):
            vb += int(v[f]).to_bytes(n,"little",signed=sg)
        hx = lambda b: [f"{x:02x}" for x in b]
        subprocess.run(["bpftool","map","update","pinned","/sys/fs/bpf/bwp/maps_v1/cni_bandwidth","key","hex"]+hx(kb)+["value","hex"]+hx(vb), check=True)
        print("set mark_us", us, "on ifindex", idx)
PY
