#!/bin/bash
# cni.sh VERB NET POD RATE(bit/s, 0=none)
verb=$1 net=$2 pod=$3 rate=$4
cap=""
if [ "$rate" != 0 ]; then cap="{\"bandwidth\":{\"ingressRate\":$rate,\"ingressBurst\":4294967295,\"egressRate\":$rate,\"egressBurst\":4294967295}}"; fi
exec unshare -m --propagation private sh -c "mount --bind /tmp/bwp/varlib /var/lib && \
  NETCONFPATH=/tmp/bwp/net.d CNI_PATH=/tmp/bwp/bin CNI_IFNAME=eth0 CAP_ARGS='$cap' nsenter --net=/run/netns/bwp-node /tmp/bwp/bin/cnitool $verb $net /run/netns/$pod"
