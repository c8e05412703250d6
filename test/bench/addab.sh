#!/bin/bash
# Interleaved agent-less ADD/DEL rounds of two ebpf-cni builds and ptp, the
# way a runtime execs them (issue 30: many short rounds beat one long run on
# a shared machine). Usage, as root:
#   test/bench/addab.sh DIR_A DIR_B CNI_BIN_DIR [ROUNDS] > rounds.txt
# DIR_A and DIR_B each hold an ebpf-cni binary; CNI_BIN_DIR holds ptp and
# host-local. Everything runs in a node netns made here (addab-node, entered
# with nsenter so /sys keeps bpffs), each pod in a netns of its own; no
# packet is sent. Prints "round build add_us=N del_us=N"; EBPF_CNI_TRACE
# lines go to trace-a.log and trace-b.log in $WORK (default a temp dir).
set -u
A=$1 B=$2 CNIBIN=$3 R=${4:-20}
W=${WORK:-$(mktemp -d)}
NODE=addab-node
ip netns add $NODE 2>/dev/null
ip -n $NODE link set lo up
trap 'ip netns del $NODE 2>/dev/null; rm -rf /sys/fs/bpf/addab-a-$$ /sys/fs/bpf/addab-b-$$' EXIT
declare -A DIR=([a]=$A [b]=$B [ptp]=$CNIBIN) SUB=([a]=10.254.1.0/24 [b]=10.254.2.0/24 [ptp]=10.254.3.0/24)
run() { # build verb pod id
	local b=$1 type=ebpf-cni extra
	[ $b = ptp ] && type=ptp
	extra=""
	[ $type = ebpf-cni ] && extra="\"pinDir\":\"/sys/fs/bpf/addab-$b-$$\",\"stateDir\":\"$W/state-$b\","
	local conf="{\"cniVersion\":\"1.0.0\",\"name\":\"addab-$b\",\"type\":\"$type\",$extra\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"$W/ipam-$b\",\"ranges\":[[{\"subnet\":\"${SUB[$b]}\"}]]}}"
	local t0 t1
	t0=$(date +%s%N)
	echo "$conf" | nsenter --net=/run/netns/$NODE env CNI_COMMAND=$2 CNI_CONTAINERID=$4 CNI_NETNS=/run/netns/$3 \
		CNI_IFNAME=eth0 CNI_PATH=$CNIBIN:${DIR[$b]} EBPF_CNI_TRACE=1 ${DIR[$b]}/$type >/dev/null 2>>$W/trace-$b.log ||
		echo "FAIL $b $2" >&2
	t1=$(date +%s%N)
	echo $(((t1 - t0) / 1000))
}
for r in $(seq 0 $R); do # round 0 loads the datapaths: not printed
	for b in a b ptp; do
		pod=addab-$b-$r-$$
		ip netns add $pod
		a=$(run $b ADD $pod c$r)
		d=$(run $b DEL $pod c$r)
		ip netns del $pod
		[ $r = 0 ] || echo "$r $b add_us=$a del_us=$d"
	done
done
