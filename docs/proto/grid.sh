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
WQ=$((R/8*15/10000)); [ $WQ -lt 3000 ] && WQ=3000   # 1.5 ms of the rate
BQ=$((R/8/1000)); [ $BQ -lt 3028 ] && BQ=3028     # 1 ms, at least two full frames (TBF segments bigger GSO packets)
LQ=$((R/8/20+BQ+65536))                           # the bucket's 50 ms, the burst, one GSO packet: the bucket decides, never the tail drop
MQ=$((2*1514*8*1000000/R)); [ $MQ -lt 2000 ] && MQ=2000   # us
tbfq() { tc -n bwp-node qdisc replace dev $V root stab overhead 0 linklayer ethernet tbf rate ${M}mbit burst $BQ limit $LQ; }
BH=$((R/8/1000)); [ $BH -lt 3028 ] && BH=3028
htbq() { tc -n bwp-node qdisc del dev $V root 2>/dev/null; tc -n bwp-node qdisc add dev $V root handle 1: stab overhead 0 linklayer ethernet htb default 10 && tc -n bwp-node class add dev $V parent 1: classid 1:10 htb rate ${M}mbit ceil ${M}mbit burst $BH cburst $BH quantum 60000 && tc -n bwp-node qdisc add dev $V parent 1:10 handle 10: bfifo limit $LQ; }
echo "# H: htb(stab) burst $BH"
echo "# Q: window $WQ tbf(stab) burst $BQ limit $LQ mark ${MQ}us"
for v in $VARS; do
case $v in
A) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "A policer";;
B) notbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "B policer+window";;
C) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "C policer+ECN(sender ecn=1)";;
D) tbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "D tbf";;
E) tbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; run "E tbf+window";;
F) tbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "F tbf+ECN(sender ecn=1)";;
H) tbf; ./setwnd.sh bwp-pe $W >/dev/null; ./setmark.sh $V 2000 >/dev/null; ecn 1; CCS=cubic run "H tbf+window+ECN(sender ecn=1)";;
Q) tbfq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 2; run "Q tbf(stab)+window+mark";;
QE) tbfq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 1; CCS=cubic run "QE Q, sender ecn=1";;
QP) tbfq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 2; for cc in cubic bbr; do printf "%-4s %-40s %-5s " "${M}M" "QP Q, 4 streams" $cc; ./meas.py bwp-pe $IP $R 10 $cc -P 4; done;;
QN) tbfq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 2; for cc in cubic bbr; do printf "%-4s %-40s %-5s " "${M}M" "QN Q, node->pod (paced)" $cc; ./meas2.py bwp-node bwp-pe $IP $R 10 $cc; done;;
AN) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; ecn 2; for cc in cubic; do printf "%-4s %-40s %-5s " "${M}M" "AN policer, node->pod (paced)" $cc; ./meas2.py bwp-node bwp-pe $IP $R 10 $cc; done;;
QU) tbfq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; printf "%-4s %-40s %-5s " "${M}M" "QU Q, UDP 2x offered" udp; ./meas2.py bwp-remote bwp-pe $IP $R 10 cubic -u -b $((2*M))M -l 1400;;
AU) notbf; ./setwnd.sh bwp-pe 0 >/dev/null; ./setmark.sh $V 0 >/dev/null; printf "%-4s %-40s %-5s " "${M}M" "AU policer, UDP 2x offered" udp; ./meas2.py bwp-remote bwp-pe $IP $R 10 cubic -u -b $((2*M))M -l 1400;;
H) htbq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 2; run "H htb(stab)+window+mark";;
HN) htbq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 2; for cc in cubic bbr; do printf "%-4s %-40s %-5s " "${M}M" "HN H, node->pod (paced)" $cc; ./meas2.py bwp-node bwp-pe $IP $R 10 $cc; done;;
HE) htbq; ./setwnd.sh bwp-pe $WQ >/dev/null; ./setmark.sh $V $MQ >/dev/null; ecn 1; CCS=cubic run "HE H, sender ecn=1";;
G) ecn 2; ./cni.sh del bwp-chain bwp-pc 1 >/dev/null 2>&1; ./cni.sh add bwp-chain bwp-pc $R > /tmp/bwp/addc.json; CIP=$(python3 -c 'import json;print(json.load(open("/tmp/bwp/addc.json"))["ips"][0]["address"].split("/")[0])');
   for cc in cubic bbr; do printf "%-4s %-40s %-5s " "${M}M" "G ptp+bandwidth" $cc; HOSTIF= ./meas.py bwp-pc $CIP $R 10 $cc; done;;
esac
done
ecn 2
