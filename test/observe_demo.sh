#!/usr/bin/env bash
# The session of docs/observe.md: "why can't my pod reach X", answered with
# ebpf-agent observe. One node namespace with the agent, two pods ADDed by
# the real plugin through cnitool (with the pod names a kubelet passes),
# everything removed on exit. Run as root from the repository root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "observe demo: run as root" >&2; exit 1; }

ID=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
NODE=ebpfobs-node-$ID
WEB=ebpfobs-web-$ID
DB=ebpfobs-db-$ID
WORK=$(mktemp -d /tmp/ebpf-cni-observe.XXXXXX)
PIN=/sys/fs/bpf/ebpfobs-$ID
NET=ebpfobs-$ID
AGENT_PID=
SRV_PID=

show() { printf '\n$ %s\n' "$*"; "$@"; }
innode() { nsenter --net=/var/run/netns/$NODE "$@"; }
agent() { "$WORK/bin/ebpf-agent" "$@" --pin-dir "$PIN" --state-dir "$WORK/state"; }
cnitool() { # cnitool VERB NETNS NAMESPACE/NAME
	innode env NETCONFPATH=$WORK/net.d CNI_PATH=$WORK/bin CNI_IFNAME=eth0 \
		CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=${3%/*};K8S_POD_NAME=${3#*/}" "$WORK/bin/cnitool" "$1" $NET /var/run/netns/$2
}

cleanup() {
	set +e
	[ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null
	[ -n "$AGENT_PID" ] && kill "$AGENT_PID" && wait "$AGENT_PID" 2>/dev/null
	[ -e /var/run/netns/$WEB ] && cnitool del $WEB shop/web >/dev/null 2>&1
	[ -e /var/run/netns/$DB ] && cnitool del $DB shop/db >/dev/null 2>&1
	ip netns del $WEB 2>/dev/null
	ip netns del $DB 2>/dev/null
	ip netns del $NODE 2>/dev/null
	rm -rf "$WORK" "$PIN"
}
trap cleanup EXIT

cd "$ROOT"
go build -o "$WORK/bin/" ./cmd/ebpf-cni ./cmd/ebpf-agent \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/cni/cnitool
mountpoint -q /sys/fs/bpf || mount -t bpf bpffs /sys/fs/bpf
mkdir -p "$WORK/net.d"
cat > "$WORK/net.d/10-obs.conflist" <<CONF
{"cniVersion": "1.0.0", "name": "$NET", "plugins": [{"type": "ebpf-cni", "pinDir": "$PIN", "stateDir": "$WORK/state",
  "ipam": {"type": "host-local", "dataDir": "$WORK/ipam", "ranges": [[{"subnet": "10.250.0.0/24"}]]}}]}
CONF
ip netns add $NODE
ip netns add $WEB
ip netns add $DB
innode ip link set lo up
innode ip addr add 192.0.2.1/32 dev lo
cnitool add $WEB shop/web > "$WORK/web.json"
cnitool add $DB shop/db > "$WORK/db.json"
ipof() { grep -o '"address": "[^"]*"' "$1" | head -1 | cut -d'"' -f4 | cut -d/ -f1; }
DBIP=$(ipof "$WORK/db.json")
innode "$WORK/bin/ebpf-agent" run --pin-dir "$PIN" --state-dir "$WORK/state" --cni-conf-dir "$WORK/net.d" \
	--cni-bin-dir "$WORK/bin" --metrics-addr 127.0.0.1:9964 --hostports=false 2>"$WORK/agent.log" &
AGENT_PID=$!
until agent events 2>/dev/null | grep -q "agent: read"; do sleep 0.2; done
ip netns exec $DB python3 -m http.server 8080 --bind "$DBIP" >/dev/null 2>&1 &
SRV_PID=$!

echo "# shop/db is $DBIP; shop/web's application sends from an address of its own (a sidecar added it)"
ip -n $WEB addr add 10.250.0.200/32 dev eth0
show ip netns exec $WEB curl -sS -m 2 --interface 10.250.0.200 http://$DBIP:8080/ || true
show ip netns exec $WEB ping -c 2 -W 1 -I 10.250.0.200 $DBIP || true

show agent observe --pod shop/web --verdict dropped --last 5
show agent observe --pod shop/web --verdict dropped --protocol tcp --last 1 -o json

echo "# the fix: the application sends from the pod's own address"
ip -n $WEB addr del 10.250.0.200/32 dev eth0
show agent events --flows-pod shop/web
show ip netns exec $WEB curl -sS -m 2 -o /dev/null -w '%{http_code}\n' http://$DBIP:8080/
sleep 0.3
show agent observe --pod shop/web --verdict forwarded --protocol tcp --last 4
show agent events
printf '\n$ %s\n' "curl -s http://127.0.0.1:9964/metrics | grep -E '^ebpf_cni_(drop_events|flow_events|events_lost)'"
innode curl -s http://127.0.0.1:9964/metrics | grep -E '^ebpf_cni_(drop_events|flow_events|events_lost)'
