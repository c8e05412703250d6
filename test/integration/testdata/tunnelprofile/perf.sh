#!/bin/sh
# A system-wide CPU profile of one TestTunnelProfile run per mode
# (TUNNEL_PROFILE_CMD=testdata/tunnelprofile/perf.sh): the cpu-clock event
# (this machine has no hardware counters), 2000 Hz, call graphs, into
# $TUNNEL_PROFILE_OUT (default /tmp)/perf-<mode>.data. Read with e.g.
#   perf report -i /tmp/perf-vxlan.data --no-children --comm iperf3 --sort sym -g none -n
sleep 1
exec perf record -e cpu-clock -F 2000 -a -g -o "${TUNNEL_PROFILE_OUT:-/tmp}/perf-$TUNNEL_MODE.data" -- sleep $((TUNNEL_PROFILE_SECS - 3))
