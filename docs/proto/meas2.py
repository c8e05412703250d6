#!/usr/bin/env python3
"""meas2.py SRC_NS DST_NS IP RATE secs cc [iperf args]: generic iperf3 src->dst with ping from src."""
import json, subprocess, sys, time, os
src, dst, ip, rate = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
secs = int(sys.argv[5]); cc = sys.argv[6]; extra = sys.argv[7:]
port = str(5201 + os.getpid() % 1000)
load = open("/proc/loadavg").read().split()[0]
srv = subprocess.Popen(["ip","netns","exec",dst,"iperf3","-s","-1","-J","-i","1","-B",ip,"-p",port], stdout=subprocess.PIPE)
time.sleep(0.5)
cli = subprocess.Popen(["ip","netns","exec",src,"iperf3","-c",ip,"-p",port,"-t",str(secs),"-i","1","-J","-C",cc]+extra, stdout=subprocess.PIPE)
time.sleep(1.5)
n = int((secs-2)/0.2)
pg = subprocess.run(["ip","netns","exec",src,"ping","-n","-c",str(n),"-i","0.2","-W","2",ip], capture_output=True, text=True).stdout
cj = json.loads(cli.communicate()[0]); sj = json.loads(srv.communicate()[0])
rtts = sorted(float(l.split("time=")[1].split()[0]) for l in pg.splitlines() if "time=" in l)
ivs = [i["sum"] for i in sj["intervals"] if i["sum"]["seconds"] > 0.5]
r = [i["bits_per_second"]/rate for i in ivs]
e = sj["end"]; mean = (e.get("sum_received") or e.get("sum"))["bits_per_second"]/rate
retr = cj["end"].get("sum_sent",{}).get("retransmits")
lost = cj["end"].get("sum",{}).get("lost_percent")
p = lambda q: rtts[min(len(rtts)-1,int(q*len(rtts)))] if rtts else float('nan')
print(f"mean {mean:.3f} first {r[0]:.3f} min {min(r):.3f} max {max(r):.3f} retr {retr} udp_lost% {lost} ping p50 {p(.5):.2f} p90 {p(.9):.2f} lost {n-len(rtts)}/{n} load {load} | " + " ".join(f"{x:.2f}" for x in r))
