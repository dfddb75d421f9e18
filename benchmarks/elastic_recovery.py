"""Elastic recovery on the emulated cluster (benchmarks/cluster): N hosts at
1 Gbit/s, one worker each, train the digits MLP under
`gradflowrun --min-np N-1 -np N --max-np N` (tests/parallel/elastic_torch_script.py,
commit every 4 batches); the worker on the last host SIGKILLs itself at
step KILL_STEP (between two commits). Reported per run: recovery time (the kill to the first
completed step on N-1 ranks), steps lost (rolled back to the last commit),
final accuracy against a fault-free run of the same N, and whether the
survivors' parameters are identical. For N > 2 also a growing job: the
discovery script lists N-1 hosts, then the last one too (run_grow_job).

    python -m benchmarks.elastic_recovery --hosts 2 4 --repeats 3   # needs root (netns)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from benchmarks import cluster as cl  # noqa: E402

SCRIPT = os.path.join(ROOT, "tests", "parallel", "elastic_torch_script.py")
# The script commits every 4 batches of an epoch and at its end; an epoch is
# 22 steps on 2 ranks and 11 on 4 (1400 samples, 32 per rank), so after 32
# steps both are at batch 10 of an epoch, 2 steps after the commit at batch 8:
# the survivors lose (repeat) 2 steps. A kill right on a commit (step 30
# here) would always show 0.
KILL_STEP = 32


def run_job(c, n: int, log_dir: str, kill: bool, epochs: int,
            source_tree: Optional[bool] = None) -> dict:
    """One job; source_tree: run the gradflow of this source tree (default:
    when it has a built extension) rather than the installed one."""
    if source_tree is None:
        source_tree = bool(glob.glob(os.path.join(ROOT, "gradflow", "_native*.so")))
    env = c.env(n)
    env.update(ELASTIC_LOG=log_dir, ELASTIC_EPOCHS=str(epochs),
               OMP_NUM_THREADS="1", MPIR_CVAR_POLLS_BEFORE_YIELD="10")
    if source_tree:
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if kill:
        env["ELASTIC_KILL"] = f"{n - 1}:{KILL_STEP}"
    h0 = c.host_ip(0)
    hosts = ",".join(f"{c.host_ip(k)}:1" for k in range(n))
    cmd = c.host_command(0, [sys.executable, "-m", "gradflow.runner.launch",
                             "--min-np", str(max(1, n - 1)), "-np", str(n), "--max-np", str(n),
                             "-H", hosts, "--network-interface", cl.IFACE, "--mpi-args",
                             f"-launcher rsh -launcher-exec {cl.RSH} -localhost {h0}",
                             sys.executable, SCRIPT])
    t0 = time.monotonic()
    r = c.run_command(cmd, cwd=ROOT if source_tree else tempfile.gettempdir(), env=env,
                      timeout=600)
    wall = time.monotonic() - t0
    ev = []
    for path in glob.glob(os.path.join(log_dir, "worker-*.jsonl")):
        with open(path) as f:
            ev += [json.loads(line) for line in f if line.strip()]
    ev.sort(key=lambda e: e["t"])
    res = [e for e in ev if e["event"] == "result"]
    out = {"n": n, "kill": kill, "rc": r.returncode, "wall_s": round(wall, 2),
           "acc": res[0]["acc"] if res else None, "final_size": res[0]["size"] if res else None,
           "identical": len({e["hash"] for e in res}) == 1 and len(res) > 0}
    if r.returncode != 0:
        out["stderr"] = r.stderr[-2000:]
    if kill:
        k = [e for e in ev if e["event"] == "kill"]
        after = [e for e in ev if e["event"] == "step" and e["size"] == n - 1]
        if k and after:
            first = min(after, key=lambda e: e["t"])
            out["recovery_s"] = round(first["t"] - k[0]["t"], 3)
            out["steps_lost"] = KILL_STEP - (first["step"] - 1)
    return out


def run_grow_job(c, n: int, log_dir: str, epochs: int,
                 source_tree: Optional[bool] = None) -> dict:
    """Start on hosts 0..n-2 (the discovery script lists them), add host n-1
    to the script's output once training runs: the new worker starts there,
    joins at the running workers' next commit and gets the state. Reports
    the time from the change to the first step on n ranks (it includes the
    new worker's Python/torch start-up) and whether all n end identical."""
    if source_tree is None:
        source_tree = bool(glob.glob(os.path.join(ROOT, "gradflow", "_native*.so")))
    env = c.env(n)
    env.update(ELASTIC_LOG=log_dir, ELASTIC_EPOCHS=str(epochs), ELASTIC_STEP_SLEEP="0.05",
               ELASTIC_WAIT=f"{n}:1", OMP_NUM_THREADS="1",
               MPIR_CVAR_POLLS_BEFORE_YIELD="10")
    if source_tree:
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    hosts_file = os.path.join(log_dir, "hosts.txt")
    with open(hosts_file, "w") as f:
        f.write("".join(f"{c.host_ip(k)}:1\n" for k in range(n - 1)))
    script = os.path.join(log_dir, "discover.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts_file}\n")
    os.chmod(script, 0o755)
    h0 = c.host_ip(0)
    cmd = c.host_command(0, [sys.executable, "-m", "gradflow.runner.launch",
                             "--min-np", str(n - 1), "--max-np", str(n),
                             "--host-discovery-script", script,
                             "--network-interface", cl.IFACE, "--mpi-args",
                             f"-launcher rsh -launcher-exec {cl.RSH} -localhost {h0}",
                             sys.executable, SCRIPT])
    p = subprocess.Popen(cmd, cwd=ROOT if source_tree else tempfile.gettempdir(), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not _events(log_dir, "step"):
            time.sleep(0.2)
        added = time.time()
        with open(hosts_file, "a") as f:
            f.write(f"{c.host_ip(n - 1)}:1\n")
        out, _ = p.communicate(timeout=600)
    except BaseException:
        c.kill_jobs(p)
        raise
    ev = _events(log_dir)
    res = [e for e in ev if e["event"] == "result"]
    grown = [e for e in ev if e["event"] == "step" and e["size"] == n]
    row = {"n": n, "grow": True, "rc": p.returncode, "final_size": res[0]["size"] if res else None,
           "identical": len({e["hash"] for e in res}) == 1 and len(res) > 0,
           "acc": res[0]["acc"] if res else None}
    if grown:
        row["join_s"] = round(min(e["t"] for e in grown) - added, 3)
    ready = [line for line in out.splitlines() if "ready" in line and "after its start" in line]
    if ready:
        row["newcomer"] = ready[0].split("elastic: ", 1)[-1]
        row["ready_s"] = float(row["newcomer"].split(" ready ")[1].split(" s ")[0])
    if p.returncode != 0:
        row["output"] = out[-2000:]
    return row


def _events(log_dir: str, kind: Optional[str] = None) -> list:
    ev = []
    for path in glob.glob(os.path.join(log_dir, "worker-*.jsonl")):
        with open(path) as f:
            ev += [json.loads(line) for line in f if line.strip()]
    ev.sort(key=lambda e: e["t"])
    return [e for e in ev if kind is None or e["event"] == kind]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--rate", default="1gbit")
    args = ap.parse_args()
    why = cl.unavailable_reason()
    if why:
        print(f"elastic_recovery: cannot build the emulated cluster: {why}", file=sys.stderr)
        return 2
    rows = []
    with cl.Cluster(max(args.hosts), rate=args.rate, delay="0", name=f"el{os.getpid()}") as c:
        for n in args.hosts:
            for rep in range(args.repeats):
                for kill in (False, True):
                    with tempfile.TemporaryDirectory() as d:
                        row = run_job(c, n, d, kill, args.epochs)
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                if n > 2:
                    with tempfile.TemporaryDirectory() as d:
                        row = run_grow_job(c, n, d, args.epochs)
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores, rate {args.rate}")
    print("| N | recovery s (median, min-max) | steps lost | acc fault-free | acc with a kill | "
          "survivors identical |")
    print("|---|---|---|---|---|---|")
    for n in args.hosts:
        clean = [r for r in rows if r["n"] == n and not r.get("kill") and not r.get("grow")]
        faulty = [r for r in rows if r["n"] == n and r.get("kill") and "recovery_s" in r]
        if not faulty:
            print(f"| {n} | failed | | | | |")
            continue
        rec = [r["recovery_s"] for r in faulty]
        print(f"| {n} | {statistics.median(rec):.2f} ({min(rec):.2f}-{max(rec):.2f}) | "
              f"{statistics.median(r['steps_lost'] for r in faulty):g} | "
              f"{statistics.median(r['acc'] for r in clean if r['acc'] is not None):.4f} | "
              f"{statistics.median(r['acc'] for r in faulty):.4f} | "
              f"{all(r['identical'] for r in faulty)} |")
    grows = [r for r in rows if r.get("grow") and "join_s" in r]
    if grows:
        print("\n| N | host added: change -> first step on N ranks, s (median, min-max) | "
              "of which the joiner's start-up (launch to ready), s | all N identical |\n"
              "|---|---|---|---|")
        for n in sorted({r["n"] for r in grows}):
            js = [r["join_s"] for r in grows if r["n"] == n]
            rs = [r["ready_s"] for r in grows if r["n"] == n and "ready_s" in r] or [float("nan")]
            print(f"| {n - 1} -> {n} | {statistics.median(js):.2f} ({min(js):.2f}-{max(js):.2f}) | "
                  f"{statistics.median(rs):.1f} ({min(rs):.1f}-{max(rs):.1f}) | "
                  f"{all(r['identical'] and r['final_size'] == n for r in grows if r['n'] == n)} |")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
