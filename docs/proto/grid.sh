#!/bin/bash
# grid.sh RATE_MBIT [variants...] : one pass of the candidates at one rate
cd /tmp/bwp
M=$1; shift
R=$((M*1000000))
VARS=${@:-A B C D E F G}
export RATE=$R
read IP V < <(./readd.sh)
export HOSTIF=$V
W=$((R/8*25/10000))          # 2.5 ms of the rate, bytes
[ $W -lt 3000 ] && W=3000
B=$((R/8/1000)); [ $B -lt 3028 ] && B=3028   # 1 ms, at least 2 full frames
L=$((R/8/100)); [ $L -lt 15000 ] && L=15000   # 10 ms
echo "# rate ${M}M ip $IP veth $V window $W tbf burst $B limit $L"
notbf() { tc -n bwp-node qdisc del dev $V root 2>/dev/null; true; }
tbf() { tc -n bwp-node qdisc replace dev $V root tbf rate ${M}mbit burst $B limit $L; }
run() { for cc in ${CCS:-cubic bbr}; do printf "%-4s %-40s %-5s " "${M}M" "$1" $cc; ./meas.py bwp-pe $IP $R 10 $cc; done; }
ecn() { ip netns exec bwp-remote sysctl -qw net.ipv4.tcp_ecn=$1; }
for v in $VARS; do
case $v in
A) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "A policer";;
B) notbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "B policer+window";;
C) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "C policer+ECN(sender ecn=1)";;
D) tbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "D tbf";;
E) tbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "E tbf+window";;
F) tbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "F tbf+ECN(sender ecn=1)";;
H) tbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "H tbf+window+ECN(sender ecn=1)";;
G) ecn 2; ./cni.sh del bwp-chain bwp-pc 1 >/dev/null 2>&1; ./cni.sh add bwp-chain bwp-pc $R > /tmp/bwp/addc.json; CIP=$(python3 -c 'import json;print(json.load(open("/tmp/bwp/addc.json"))["ips"][0]["address"].split("/")[0])');
   for cc in cubic bbr; do printf "%-4s %-40s %-5s " "${M}M" "G ptp+bandwidth" $cc; HOSTIF= ./meas.py bwp-pc $CIP $R 10 $cc; done;;
esac
done
ecn 2
