#!/usr/bin/env bash
# ebpf-cni demo: one node namespace, two pods wired by the real plugin binary
# driven through cnitool exactly as a runtime does, traffic between them, and
# a dump of the pinned maps. Everything it creates is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "demo: run as root (network namespaces, BPF)" >&2; exit 1; }

ID=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
NODE=ebpfdemo-node-$ID
PODA=ebpfdemo-a-$ID
PODB=ebpfdemo-b-$ID
WORK=$(mktemp -d /tmp/ebpf-cni-demo.XXXXXX)
PIN=/sys/fs/bpf/ebpfdemo-$ID
NET=ebpfdemo-$ID

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
innode() { nsenter --net=/var/run/netns/$NODE "$@"; }
cnitool() {
	innode env NETCONFPATH=$WORK/net.d CNI_PATH=$WORK/bin CNI_IFNAME=eth0 "$WORK/bin/cnitool" "$@"
}

cleanup() {
	set +e
	for p in $PODA $PODB; do
		[ -e /var/run/netns/$p ] && cnitool del $NET /var/run/netns/$p >/dev/null 2>&1
		ip netns del $p 2>/dev/null
	done
	ip netns del $NODE 2>/dev/null
	rm -rf "$WORK" "$PIN"
}
trap cleanup EXIT

say "building ebpf-cni, ebpf-agent, host-local and cnitool"
cd "$ROOT"
go build -o "$WORK/bin/" ./cmd/ebpf-cni ./cmd/ebpf-agent \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/cni/cnitool

mountpoint -q /sys/fs/bpf || mount -t bpf bpffs /sys/fs/bpf

mkdir -p "$WORK/net.d"
cat > "$WORK/net.d/10-demo.conflist" <<CONF
{
  "cniVersion": "1.0.0",
  "name": "$NET",
  "plugins": [{
    "type": "ebpf-cni",
    "pinDir": "$PIN",
    "stateDir": "$WORK/state",
    "ipam": {
      "type": "host-local",
      "dataDir": "$WORK/ipam",
      "ranges": [[{"subnet": "10.250.0.0/24"}], [{"subnet": "fd00:250::/64"}]]
    }
  }]
}
CONF

say "node namespace $NODE (node addresses 192.0.2.1, fd00:1::1) and two pod namespaces"
ip netns add $NODE
ip netns add $PODA
ip netns add $PODB
innode ip link set lo up
innode ip addr add 192.0.2.1/32 dev lo
innode ip addr add fd00:1::1/128 dev lo

say "cnitool add (ADD through the plugin binary)"
cnitool add $NET /var/run/netns/$PODA > "$WORK/a.json"
cnitool add $NET /var/run/netns/$PODB > "$WORK/b.json"
ipof() { grep -o "\"address\": \"[^\"]*\"" "$1" | sed -n "${2}p" | cut -d'"' -f4 | cut -d/ -f1; }
A4=$(ipof "$WORK/a.json" 1); A6=$(ipof "$WORK/a.json" 2)
B4=$(ipof "$WORK/b.json" 1); B6=$(ipof "$WORK/b.json" 2)
echo "pod A: $A4 $A6"
echo "pod B: $B4 $B6"
ip -n $PODA addr show eth0
ip -n $PODA route

say "pod A -> pod B (same node, bpf_redirect_peer)"
ip netns exec $PODA ping -c 3 -i 0.2 $B4
ip netns exec $PODA ping -6 -c 3 -i 0.2 $B6

say "pod A -> node and node -> pod B"
ip netns exec $PODA ping -c 2 -i 0.2 192.0.2.1
innode ping -c 2 -i 0.2 $B4

if command -v iperf3 >/dev/null; then
	say "TCP: iperf3 pod A -> pod B, 3 s"
	ip netns exec $PODB iperf3 -s -1 -D -B $B4 --logfile "$WORK/iperf3.log"
	sleep 0.3
	ip netns exec $PODA iperf3 -c $B4 -t 3 -f m | tail -4
fi

say "a spoofed source address from pod A is dropped"
ip -n $PODA addr add 10.250.0.200/32 dev eth0
ip netns exec $PODA ping -c 2 -W 1 -I 10.250.0.200 $B4 || echo "(dropped, as it should be)"
ip -n $PODA addr del 10.250.0.200/32 dev eth0

say "cnitool check"
cnitool check $NET /var/run/netns/$PODA && echo "CHECK ok"

say "ebpf-agent dump endpoints (straight from the pinned maps)"
innode "$WORK/bin/ebpf-agent" dump endpoints --pin-dir "$PIN" --state-dir "$WORK/state"

if command -v bpftool >/dev/null; then
	say "bpftool map dump pinned $PIN/maps_v*/cni_links"
	bpftool map dump pinned "$PIN"/maps_v*/cni_links
fi

say "cnitool del, then nothing is left"
cnitool del $NET /var/run/netns/$PODA
cnitool del $NET /var/run/netns/$PODB
echo "veths left in node: $(innode ip -o link | grep -c ebpf || true)"
echo "endpoints left: $(innode "$WORK/bin/ebpf-agent" dump endpoints --pin-dir "$PIN" --state-dir "$WORK/state" -o json)"
say "demo done"
