#!/usr/bin/env python3
"""A bring-up's progress curve (issue 30 item 5): a sandbox with N copies of fixture 05's second
Node, one release controller with leader election and QPS unlimited; polls the sandbox's
nodesWithPodCIDRs every 50 ms and prints every plateau longer than 0.3 s and the serve-all time.
Usage: fence_progress.py CONTROLLER N (SANDBOX: default target/debug/sandbox-apiserver)."""
import json, os, subprocess, sys, time, urllib.request
ctl, n = sys.argv[1], int(sys.argv[2])
sb = subprocess.Popen([os.environ.get("SANDBOX", "target/debug/sandbox-apiserver"), "--listen", "127.0.0.1:0", "--admin", "--request-log-size", "300000",
    "--request-body-limit", "0", "--history-limit", "1000", "--replicate", f"fixtures/nodes/05-aws-4nodes-no-podcidr.json:1:{n}"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
url = next(w for w in sb.stdout.readline().split() if w.startswith("http://"))
def summary(): return json.loads(urllib.request.urlopen(url + "/sandbox/summary", timeout=60).read())
t0 = time.time()
p = subprocess.Popen([ctl, f"--master={url}", "--cluster-cidr=10.0.0.0/8", "--leader-elect=true", "--metrics-bind-address=0",
    "--health-probe-bind-address=0", "--secure-port=0", "--kube-api-qps=100000", "--kube-api-burst=100000"],
    stdout=open(os.environ.get("OUT_LOG", "/tmp/fence-progress.log"), "w"), stderr=subprocess.STDOUT)
pts = []
while True:
    s = summary(); t = time.time() - t0
    pts.append((round(t, 2), s["nodesWithPodCIDRs"]))
    if s["nodesWithPodCIDRs"] >= n: break
    time.sleep(0.05)
p.terminate(); p.wait(); sb.terminate()
# print plateaus: intervals > 0.3 s without progress
last_t, last_v = pts[0]
for t, v in pts:
    if v != last_v:
        if t - last_t > 0.3 and last_v > 0: print(f"stall {last_t:.2f}-{t:.2f}s at {last_v}")
        last_t, last_v = t, v
print("served", pts[-1][0], "first progress", next(t for t, v in pts if v > 0))
