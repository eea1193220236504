#!/usr/bin/env python3
"""One run: debug sandbox with N replicated Nodes, a release controller; counts every request the
sandbox logged by resource/verb, serve time, CPU s, peak RSS; optional hand-over (SIGKILL at N/2,
a second controller takes over). Usage: count.py CONTROLLER N MODE LE HANDOVER TAG"""
import json, os, signal, subprocess, sys, time, urllib.request
ctl, n, mode, le, handover, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1", sys.argv[6]
SB = os.environ.get("SANDBOX", "target/debug/sandbox-apiserver")
FIX = os.environ.get("FIXTURE", "fixtures/nodes/05-aws-4nodes-no-podcidr.json")
out = os.path.join(os.environ.get("OUT_DIR", "/tmp/fence-cost"), tag)
os.makedirs(os.path.dirname(out), exist_ok=True)
load = open("/proc/loadavg").read().split()[0]
sb = subprocess.Popen([SB, "--listen", "127.0.0.1:0", "--admin", "--request-log-size", "3000000",
                       "--request-body-limit", "0", "--history-limit", "1000", "--replicate", f"{FIX}:1:{n}"],
                      stdout=subprocess.PIPE, stderr=open(out + "-sandbox.log", "w"), text=True)
url = next(w for w in sb.stdout.readline().split() if w.startswith("http://"))
def get(path):
    return json.loads(urllib.request.urlopen(url + path, timeout=60).read())
def summary():
    return get("/sandbox/summary")
def start():
    args = [ctl, f"--master={url}", "--cluster-cidr=10.0.0.0/8", f"--leader-elect={le}",
            "--metrics-bind-address=0", "--health-probe-bind-address=0", "--secure-port=0"]
    if mode == "unlimited":
        args += ["--kube-api-qps=100000", "--kube-api-burst=100000"]
    log = open(out + f"-ctl{time.time():.0f}.log", "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log.name
def usage(pid):
    st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    hwm = [l for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM")][0].split()[1]
    return cpu, int(hwm) / 1024
res = {"tag": tag, "n": n, "mode": mode, "le": le, "load": load, "ctl": ctl}
t0 = time.time(); p, logname = start()
target = n // 2 if handover else n
while summary()["nodesWithPodCIDRs"] < target:
    time.sleep(0.02)
res["served_s"] = round(time.time() - t0, 3)
if handover:
    p.send_signal(signal.SIGKILL); p.wait()
    served_before = summary()["nodesWithPodCIDRs"]
    patches0 = summary()["patches"]
    t1 = time.time(); p, logname = start()
    first = None
    while True:
        s = summary()
        if first is None and s["patches"] > patches0:
            first = time.time() - t1
        if s["nodesWithPodCIDRs"] >= n:
            break
        time.sleep(0.005)
    res.update(served_before=served_before, takeover_first_patch_s=round(first, 3),
               takeover_served_s=round(time.time() - t1, 3))
    txt = open(logname).read()
    for line in txt.splitlines():
        if "leading; allocating" in line:
            res["takeover_leading_line"] = line[:40]
served_reqs = get("/sandbox/requests")
time.sleep(10)  # steady state, nothing to allocate
cpu, hwm = usage(p.pid)
reqs = get("/sandbox/requests")
p.send_signal(signal.SIGTERM); p.wait(timeout=30); sb.terminate()
def count(records):
    c = {}
    for r in records:
        path = r["path"]; res_ = "leases" if "/leases" in path else "nodes" if "/nodes" in path else "events" if "/events" in path else "other"
        k = f"{res_} {r['method']}" + (" watch" if "watch=" in r.get("query", "") else "")
        c[k] = c.get(k, 0) + 1
    return c
res["cpu_s"] = cpu; res["peak_rss_mib"] = round(hwm, 1)
res["at_served"] = count(served_reqs); res["total"] = len(served_reqs)
idle = count(reqs[len(served_reqs):]); res["idle_10s"] = idle
res["lease_writes_at_served"] = sum(v for k, v in res["at_served"].items() if k.startswith("leases") and not k.startswith("leases GET"))
res["per_node_all"] = round(len(served_reqs) / n, 4)
print(json.dumps(res))
