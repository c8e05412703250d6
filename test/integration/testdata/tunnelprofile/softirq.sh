#!/bin/sh
# Where each device's receive runs, by CPU (TUNNEL_PROFILE_CMD=testdata/
# tunnelprofile/softirq.sh): the net:netif_receive_skb and
# net:napi_gro_receive_entry tracepoints system-wide for 3 s of the stream,
# counted per CPU, device and size (data: over 1000 bytes; else ACKs).
# Device names repeat across the nodes (uplink0 on both): data arriving on
# uplink0 is node 2's receive, ACKs on it node 1's. Also /proc/softirqs'
# NET_RX per CPU over the same 3 s (everything on the machine).
sleep 1
f=${TUNNEL_PROFILE_OUT:-/tmp}/softirq-$TUNNEL_MODE.data
grep NET_RX /proc/softirqs >"$f.before"
perf record -q -e net:netif_receive_skb -e net:napi_gro_receive_entry -a -o "$f" -- sleep 3 2>/dev/null
grep NET_RX /proc/softirqs >"$f.after"
echo "NET_RX per CPU, 3 s: $(paste "$f.before" "$f.after" | awk '{n=(NF-2)/2; s=""; for(i=2;i<=n+1;i++) s=s" CPU"(i-2)"="($(i+n+1)-$i); print s}')"
perf script -i "$f" -F cpu,event,trace 2>/dev/null | awk '
{ cpu=$1; gsub(/[\[\]]/,"",cpu); ev=$2; dev=""; len=0
  for (i=3;i<=NF;i++) { if ($i ~ /^dev=/) dev=substr($i,5); if ($i ~ /^len=/) len=substr($i,5)+0 }
  kind = (len > 1000) ? "data" : "small"
  n[dev" "kind" "ev" CPU"cpu]++ }
END { for (k in n) if (n[k] >= 100) printf "%8d %s\n", n[k], k }' | sort -k2,2 -k3,3 -k5,5
