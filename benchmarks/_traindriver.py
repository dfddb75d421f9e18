"""Driver side of the training benchmarks (train_throughput.py, scaling.py):
start one process group running _trainbench.py, with a timeout, and return
its JSON result or an error record (command, exit status, output tail)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402
from cluster import Cluster  # noqa: E402

WORKER = os.path.join(bu.HERE, "_trainbench.py")
KERAS_WORKER = os.path.join(bu.HERE, "_kerasbench.py")  # systems named keras*


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(systems: List[str], model: str, nranks: int, mode: str, worker_args: List[str],
              extra_env: Dict[str, str], timeout: float, cluster: Optional[Cluster] = None,
              log=sys.stdout) -> Dict[str, Dict[str, object]]:
    """Run `systems` (one family) one after another in one process group; return
    {system: result}. If the group crashes or times out, the system that was
    running gets an error record and the rest are started again in a new group.
    mode: 'local' (mpiexec -n N here, shared memory; plain python for 'torch'),
    'netns' (N MPI ranks, one per host of `cluster`) or 'netns-raw' (one process per
    host with torch's env:// variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    results: Dict[str, Dict[str, object]] = {}
    pending = list(systems)
    while pending:
        out = _launch(pending, model, nranks, mode, worker_args, extra_env,
                      timeout * len(pending), cluster, log)
        done = out.get("results", {})
        for s in pending:
            if s in done:
                r = dict(done[s])
                r.update(model=model, ranks=nranks, command=out["command"], init_seconds=out.get("init_seconds"),
                         loadavg_after=out["loadavg_after"], env=out.get("env", {}))
                for k in ("reps", "steps", "warmup", "batch_per_rank", "threads"):
                    r[k] = out.get(k)
                results[s] = r
        if "error" not in out:
            missing = [s for s in pending if s not in done]
            for s in missing:
                results[s] = {"system": s, "model": model, "ranks": nranks, "error": "no result written",
                              "output_tail": out.get("output_tail", ""), "command": out["command"]}
            break
        failed = out.get("current") or next((s for s in pending if s not in done), None)
        if failed is None:
            break
        results[failed] = {"system": failed, "model": model, "ranks": nranks, "error": out["error"],
                           "output_tail": out.get("output_tail", ""), "command": out["command"],
                           "loadavg_after": out["loadavg_after"]}
        pending = [s for s in pending if s not in done and s != failed]
        if pending:
            print(f"    retrying the remaining systems in a new process group: {', '.join(pending)}",
                  file=log, flush=True)
    return results


def _launch(systems, model, nranks, mode, worker_args, extra_env, timeout, cluster, log):
    fd, out_json = tempfile.mkstemp(prefix="gftrain-", suffix=".json")
    os.close(fd)
    os.unlink(out_json)
    worker = KERAS_WORKER if systems[0].startswith("keras") else WORKER
    py = [sys.executable, worker, "--systems", ",".join(systems), "--model", model] + list(worker_args) + [
        "--json-out", out_json]
    if mode != "local" and cluster is None:
        raise ValueError(f"mode {mode} needs the emulated cluster")
    env = bu.base_env(nranks, cluster if mode != "local" else None)
    env["PYTHONPATH"] = bu.ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    if mode == "local":
        if systems == ["torch"]:
            cmd = py
        else:
            cmd = [bu.venv_bin("mpiexec"), "-n", str(nranks)] + py
        if systems[0].startswith(("ddp", "nocomm")):
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    else:
        cmd = cluster.command(py, nranks, raw=mode == "netns-raw")
    env.update(extra_env)
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items())
    cmd_str = (shown + " " if shown else "") + bu.portable_cmd(cmd[:-2])
    print(f"    $ {cmd_str}", file=log, flush=True)
    t0 = time.time()
    rc: object
    try:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, cwd=bu.ROOT)
        lines: List[str] = []
        import threading

        def pump():
            for ln in p.stdout:
                lines.append(ln)
                if ln.startswith("[worker]"):
                    print("      " + ln.rstrip(), file=log, flush=True)
        th = threading.Thread(target=pump, daemon=True)
        th.start()
        try:
            p.wait(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            _kill_tree(p, cluster)
            rc = "timeout"
        except BaseException:
            _kill_tree(p, cluster)
            raise
        th.join(5)
        out = "".join(lines)
    except OSError as e:
        out, rc = str(e), "oserror"
    elapsed = time.time() - t0
    result: Dict[str, object] = {}
    if os.path.exists(out_json):
        with open(out_json) as f:
            result = json.load(f)
        os.unlink(out_json)
    if rc != 0:
        result["error"] = f"exit status {rc}" + (f" after {elapsed:.0f}s (limit {timeout:.0f}s)" if rc == "timeout" else "")
        result["output_tail"] = "\n".join(ln for ln in out.strip().splitlines() if not ln.startswith("[worker]"))[-4000:]
        print(f"    FAILED ({result['error']}) after {elapsed:.0f}s, while running {result.get('current')}:\n" +
              "\n".join("      | " + ln for ln in result["output_tail"].splitlines()[-25:]), file=log, flush=True)
    result.update(command=cmd_str, wall_seconds=elapsed, loadavg_after=list(os.getloadavg()))
    return result


def _kill_tree(p: subprocess.Popen, cluster: Optional[Cluster]) -> None:
    """End the process group we started and, over the emulated network, the
    processes it started inside the cluster (hydra proxies are session leaders)."""
    if cluster is not None:
        cluster.kill_jobs(p)
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        time.sleep(1.5)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
