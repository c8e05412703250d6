#!/bin/bash
# final.sh RATE_MBIT : the implementation as ADD installs it (no manual knobs)
cd /tmp/bwp
M=$1; R=$((M*1000000))
export RATE=$R
read IP V < <(./readd.sh)
export HOSTIF=$V
sed -i 's|maps_v1|maps_v2|' meas.py
echo "# rate ${M}M ip $IP veth $V load $(cut -d' ' -f1-3 /proc/loadavg)"
for cc in cubic bbr; do printf "%-5s %-28s %-5s " "${M}M" "remote TCP" $cc; ./meas.py bwp-pe $IP $R 10 $cc; done
ip netns exec bwp-remote sysctl -qw net.ipv4.tcp_ecn=1
printf "%-5s %-28s %-5s " "${M}M" "remote TCP, sender ECN" cubic; ./meas.py bwp-pe $IP $R 10 cubic
ip netns exec bwp-remote sysctl -qw net.ipv4.tcp_ecn=2
for cc in cubic bbr; do printf "%-5s %-28s %-5s " "${M}M" "remote TCP, 4 streams" $cc; ./meas.py bwp-pe $IP $R 10 $cc -P 4; done
printf "%-5s %-28s %-5s " "${M}M" "node TCP (paced)" cubic; ./meas2.py bwp-node bwp-pe $IP $R 10 cubic
printf "%-5s %-28s %-5s " "${M}M" "remote UDP 2x offered" udp; ./meas2.py bwp-remote bwp-pe $IP $R 10 cubic -u -b $((2*M))M -l 1400
