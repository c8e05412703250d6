#!/bin/bash
# readd.sh : recreate the ebpf pod with the freshly built plugin (pin dir wiped); prints ip and host if
cd /tmp/bwp
./cni.sh del bwp-ebpf bwp-pe ${RATE:-20000000} >/dev/null 2>&1
rm -rf /sys/fs/bpf/bwp
./cni.sh add bwp-ebpf bwp-pe ${RATE:-20000000} > /tmp/bwp/add.json || exit 1
python3 -c 'import json;r=json.load(open("/tmp/bwp/add.json"));print(r["ips"][0]["address"].split("/")[0], [i["name"] for i in r["interfaces"] if "sandbox" not in i][0])'
