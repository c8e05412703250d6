#!/bin/sh
# Who sends the receiving pod's ACKs (TUNNEL_PROFILE_CMD=testdata/
# tunnelprofile/acks.sh): 3 s of the stream, the server pod's Tcp counters
# (InSegs, OutSegs: its ACKs) and the call chains of the small packets its
# eth0 queues (net:net_dev_queue, len < 200): tcp_send_ack from
# __tcp_ack_snd_check (at receive, in softirq: the window advanced) or
# from tcp_cleanup_rbuf (after the application's read). The data packets
# its eth0 received are counted too (net:netif_receive_skb, len > 1000).
sleep 1
f=${TUNNEL_PROFILE_OUT:-/tmp}/acks-$TUNNEL_MODE
snmp() { nsenter --net="$TUNNEL_SERVER_NS" cat /proc/net/snmp | awk '/^Tcp:/ { if (!h) { for (i=1;i<=NF;i++) k[i]=$i; h=1 } else for (i=1;i<=NF;i++) if (k[i]=="InSegs"||k[i]=="OutSegs") printf "%s=%s ", k[i], $i }'; }
b=$(snmp)
perf record -q -g -e net:net_dev_queue --filter 'len < 200' -e net:netif_receive_skb --filter 'len > 1000' -a -o "$f.data" -- sleep 3 2>/dev/null
echo "server Tcp before: $b after: $(snmp)"
perf script -i "$f.data" -F event,trace,ip,sym 2>/dev/null | awk '
/net:netif_receive_skb/ { if ($0 ~ /dev=eth0 /) data++; ev=""; next }
/net:net_dev_queue/ { ev = ($0 ~ /dev=eth0 /) ? "q" : ""; seen=0; next }
ev=="q" && !seen && /__tcp_ack_snd_check|tcp_cleanup_rbuf|tcp_delack_timer|tcp_write_xmit|__tcp_send_ack|tcp_send_ack/ {
  for (s in want) ; 
  if ($2 ~ /^(__tcp_ack_snd_check|tcp_cleanup_rbuf|tcp_delack_timer_handler|tcp_write_xmit|tcp_rcv_established)$/) { n[$2]++; seen=1 } }
END { printf "data packets into a pod eth0: %d; small packets queued on a pod eth0, by caller:", data; for (k in n) printf " %s %d", k, n[k]; print "" }'
