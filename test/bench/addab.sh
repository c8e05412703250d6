#!/bin/bash
# Interleaved agent-less ADD/DEL rounds of two ebpf-cni builds and ptp, the
# way a runtime execs them (issue 30: many short rounds beat one long run on
# a shared machine). Usage, as root:
#   test/bench/addab.sh DIR_A DIR_B CNI_BIN_DIR [ROUNDS] > rounds.txt
# DIR_A and DIR_B each hold an ebpf-cni binary; CNI_BIN_DIR holds ptp and
# host-local. Everything runs in a node netns made here (addab-node, entered
# with nsenter so /sys keeps bpffs), each pod in a netns of its own with lo
# up, as runtimes leave it; no packet is sent. Prints "round build
# add_us=N del_us=N" and, with perf
# installed, add_cpu_us=N del_cpu_us=N: the CPU time of the verb's process
# and the IPAM plugin it execs (perf stat task-clock), which a loaded
# 2-core machine shifts far less than wall time; then the medians, quartiles
# and ratios to ptp of each. EBPF_CNI_TRACE lines go to trace-a.log and
# trace-b.log in $WORK (default a temp dir). NETCONF adds keys to both
# ebpf-cni builds' configuration, e.g. NETCONF='"networkPolicy":true'
# (ptp's stays plain).
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
	[ $type = ebpf-cni ] && extra="\"pinDir\":\"/sys/fs/bpf/addab-$b-$$\",\"stateDir\":\"$W/state-$b\",${NETCONF:+$NETCONF,}"
	local conf="{\"cniVersion\":\"1.0.0\",\"name\":\"addab-$b\",\"type\":\"$type\",$extra\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"$W/ipam-$b\",\"ranges\":[[{\"subnet\":\"${SUB[$b]}\"}]]}}"
	local t0 t1 cpu=()
	[ -n "$PERF" ] && cpu=($PERF stat -x, -e task-clock -o $W/cpu.txt)
	t0=$(date +%s%N)
	echo "$conf" | nsenter --net=/run/netns/$NODE env CNI_COMMAND=$2 CNI_CONTAINERID=$4 CNI_NETNS=/run/netns/$3 \
		CNI_IFNAME=eth0 CNI_PATH=$CNIBIN:${DIR[$b]} EBPF_CNI_TRACE=1 "${cpu[@]}" ${DIR[$b]}/$type >/dev/null 2>>$W/trace-$b.log ||
		echo "FAIL $b $2" >&2
	t1=$(date +%s%N)
	echo -n $(((t1 - t0) / 1000))
	[ -n "$PERF" ] && awk -F, '/task-clock/ { printf " %d", $1 * 1000 }' $W/cpu.txt
	echo
}
PERF=$(command -v perf)
[ -n "$PERF" ] && $PERF stat -x, -e task-clock -o /dev/null true 2>/dev/null || PERF=""
for r in $(seq 0 $R); do # round 0 loads the datapaths: not printed
	for b in a b ptp; do
		pod=addab-$b-$r-$$
		ip netns add $pod
		ip -n $pod link set lo up # as runtimes do (loopback plugin); DEL parks nexthops on it
		read -r a ac < <(run $b ADD $pod c$r)
		read -r d dc < <(run $b DEL $pod c$r)
		ip netns del $pod
		[ $r = 0 ] && continue
		echo "$r $b add_us=$a del_us=$d${ac:+ add_cpu_us=$ac del_cpu_us=$dc}"
	done
done | tee $W/rounds.txt
# Medians (quartiles) per build and field, and each build's ratio to ptp.
awk '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); v[$2, kv[1], ++n[$2, kv[1]]] = kv[2]; f[kv[1]] = 1 } b[$2] = 1 }
function q(bb, k, p,   m, i, j, t, a) { m = n[bb, k]; for (i = 1; i <= m; i++) a[i] = v[bb, k, i]
	for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return a[int((m - 1) * p) + 1] }
END { for (k in f) for (bb in b) printf "# %s %s: median %.1f ms (q1 %.1f, q3 %.1f), %.2fx ptp\n", bb, k,
	q(bb, k, .5) / 1000, q(bb, k, .25) / 1000, q(bb, k, .75) / 1000, q(bb, k, .5) / q("ptp", k, .5) }' $W/rounds.txt | sort
