#!/usr/bin/env python3
"""meas.py POD IP RATE_BPS [secs] [cc] [extra iperf client args...]
Remote netns sends TCP to the pod (iperf3 server in pod), ping from remote under load.
Prints mean ratio, per-interval min/max ratio, first-second ratio, retransmits, ping p50/p90."""
import json, subprocess, sys, time, os, statistics
pod, ip, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
secs = int(sys.argv[4]) if len(sys.argv) > 4 else 10
cc = sys.argv[5] if len(sys.argv) > 5 else "cubic"
extra = sys.argv[6:]
port = str(5201 + os.getpid() % 1000)
load = open("/proc/loadavg").read().split()[0]
hostif = os.environ.get("HOSTIF", "")
def drops():
    bpf = 0; q = 0
    if not hostif: return 0, 0
    try:
        out = subprocess.run(["nsenter","--net=/run/netns/bwp-node","/tmp/bwp/bin/ebpf-agent","dump","bandwidth","--pin-dir","/sys/fs/bpf/bwp","--state-dir","/tmp/bwp/state","-o","json"],capture_output=True,text=True).stdout
        bpf = sum(r["dropPackets"] for r in json.loads(out) if r["direction"]=="ingress" and r["interface"]==hostif)
    except Exception: pass
    out = subprocess.run(["tc","-n","bwp-node","-s","-j","qdisc","show","dev",hostif],capture_output=True,text=True).stdout
    try: q = sum(x.get("drops",0) for x in json.loads(out))
    except Exception: pass
    return bpf, q
d0 = drops()
srv = subprocess.Popen(["ip","netns","exec",pod,"iperf3","-s","-1","-J","-i","1","-B",ip,"-p",port], stdout=subprocess.PIPE)
time.sleep(0.5)
cli = subprocess.Popen(["ip","netns","exec","bwp-remote","iperf3","-c",ip,"-p",port,"-t",str(secs),"-i","1","-J","-C",cc]+extra, stdout=subprocess.PIPE)
time.sleep(1.5)
n = int((secs-2)/0.2)
pg = subprocess.run(["ip","netns","exec","bwp-remote","ping","-n","-c",str(n),"-i","0.2","-W","2",ip], capture_output=True, text=True).stdout
cj = json.loads(cli.communicate()[0]); sj = json.loads(srv.communicate()[0])
rtts = sorted(float(l.split("time=")[1].split()[0]) for l in pg.splitlines() if "time=" in l)
ivs = [i["sum"] for i in sj["intervals"] if i["sum"]["seconds"] > 0.5]
r = [i["bits_per_second"]/rate for i in ivs]
mean = sj["end"]["sum_received"]["bits_per_second"]/rate
retr = cj["end"]["sum_sent"].get("retransmits")
d1 = drops()
p = lambda q: rtts[min(len(rtts)-1,int(q*len(rtts)))] if rtts else float('nan')
print(f"mean {mean:.3f} first {r[0]:.3f} min {min(r):.3f} max {max(r):.3f} retr {retr} ping p50 {p(.5):.2f} p90 {p(.9):.2f} max {rtts[-1] if rtts else 0:.2f} lost {n-len(rtts)}/{n} drops bpf {d1[0]-d0[0]} q {d1[1]-d0[1]} load {load} | " + " ".join(f"{x:.2f}" for x in r))
