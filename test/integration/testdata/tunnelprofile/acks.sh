#!/bin/sh
# How often the receiving pod ACKs (TUNNEL_PROFILE_CMD=testdata/
# tunnelprofile/acks.sh): 3 s of the stream, the data packets a pod's eth0
# receives (net:netif_receive_skb, len > 1000: the server's) and the small
# packets a pod's eth0 queues (net:net_dev_queue, len < 200: the server's
# ACKs; the client sends none that small), and the server pod's Tcp
# InSegs/OutSegs over the same 3 s.
sleep 1
f=${TUNNEL_PROFILE_OUT:-/tmp}/acks-$TUNNEL_MODE
snmp() { nsenter --net="$TUNNEL_SERVER_NS" cat /proc/net/snmp | awk '/^Tcp:/ { if (!h) { for (i=1;i<=NF;i++) k[i]=$i; h=1 } else for (i=1;i<=NF;i++) if (k[i]=="InSegs"||k[i]=="OutSegs") printf "%s %s ", k[i], $i }'; }
b=$(snmp)
perf record -q -e net:net_dev_queue --filter 'len < 200' -e net:netif_receive_skb --filter 'len > 1000' -a -o "$f.data" -- sleep 3 2>/dev/null
a=$(snmp)
perf script -i "$f.data" -F event,trace 2>/dev/null | awk -v b="$b" -v a="$a" '
/dev=eth0 / { if ($0 ~ /netif_receive_skb/) d++; else k++ }
END { split(b, x, " "); split(a, y, " ")
  printf "server pod: %d data packets in, %d ACKs out (%.2f a packet); Tcp InSegs +%d, OutSegs +%d\n", d, k, d ? k/d : 0, y[2]-x[2], y[4]-x[4] }'
