#!/usr/bin/env python
"""What one rank pays for gradflow (issue 16, target 2: every mode >= 0.97 x
plain torch at N = 1). One process under `mpiexec -n 1` trains the MLP of
_trainbench.py (25.2 M parameters) with plain torch and with each gradflow
DistributedOptimizer mode, each on its own model, and interleaves their timed
repetitions (the order rotates every round); a mode's ratio is the median
over rounds of its samples/s over plain torch's in the same round (seconds
apart), so the load of a shared machine cancels as far as it can. Optionally several gradflow trees
(e.g. before and after a change), one process group each, alternating.

    python benchmarks/one_rank_overhead.py                        # this tree
    python benchmarks/one_rank_overhead.py --trees /old/tree .    # compare

Writes benchmarks/results/one_rank_overhead.json (every repetition).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _benchutil as bu  # noqa: E402

MODES = ["gf-pool", "gf-copy", "gf-fp16", "gf-csc0.1", "gf-csc0.01", "gf-all"]


def worker(modes: List[str], batch: int, warmup: int, steps: int, reps: int, out: str) -> None:
    """Train plain torch and every mode side by side; write samples/s per repetition."""
    import torch
    import torch.nn.functional as F
    import gradflow
    import gradflow.torch as hvd
    from _trainbench import WideMLP, _gf_optimizer
    torch.set_num_threads(1)
    hvd.init()
    assert hvd.size() == 1, "run with one rank"
    x, y = torch.randn(batch, 1024), torch.randint(0, 10, (batch,))
    runs = {}
    for system in ["torch"] + modes:
        torch.manual_seed(0)
        model = WideMLP()
        opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if system == "torch"
               else _gf_optimizer(hvd, model, system))
        runs[system] = (model, opt)

    def step(system: str) -> None:
        model, opt = runs[system]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for system in runs:
        for _ in range(warmup):
            step(system)
    res: Dict[str, List[float]] = {s: [] for s in runs}
    names = list(runs)
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for system in order:
            t0 = time.perf_counter()
            for _ in range(steps):
                step(system)
            res[system].append(batch * steps / (time.perf_counter() - t0))
    stats = gradflow.stats()
    with open(out, "w") as f:
        json.dump({"samples_per_s": res, "seconds_sparse": stats.get("seconds_sparse", 0.0),
                   "bytes_sent": stats.get("bytes_sent", 0.0)}, f)
    hvd.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", default=[bu.ROOT], help="gradflow source trees (built in place)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8, help="steps per mode before timing (pool build, "
                   "dense CSC warm-up)")
    p.add_argument("--steps", type=int, default=1, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=25, help="repetitions (rounds) per mode and group")
    p.add_argument("--groups", type=int, default=1, help="process groups per tree (alternating)")
    p.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        w = a.worker
        worker([m for m in w[0].split(",") if m], int(w[1]), int(w[2]), int(w[3]), int(w[4]), w[5])
        return 0
    trees = [os.path.abspath(t) for t in a.trees]
    raw: Dict[str, List[Dict[str, List[float]]]] = {t: [] for t in trees}
    load0, t_start = os.getloadavg()[0], time.time()
    with tempfile.TemporaryDirectory() as d:
        for g in range(a.groups):
            for t in trees:
                env = bu.base_env(1)
                env["PYTHONPATH"] = os.pathsep.join([t, HERE])
                out = os.path.join(d, f"{g}-{len(raw[t])}.json")
                cmd = bu.launcher_prefix(1) + [sys.executable, os.path.abspath(__file__), "--worker",
                                               a.modes, str(a.batch), str(a.warmup), str(a.steps),
                                               str(a.reps), out]
                subprocess.run(cmd, env=env, check=True, timeout=1200, cwd=d)
                with open(out) as f:
                    raw[t].append(json.load(f)["samples_per_s"])
                print(f"group {g + 1}/{a.groups} {t}: done (load {os.getloadavg()[0]:.1f})", flush=True)
    summary = {}
    for t in trees:
        systems = raw[t][0].keys()
        med = {s: statistics.median(v for grp in raw[t] for v in grp[s]) for s in systems}
        # Paired: each repetition's samples/s over plain torch's in the same
        # round (seconds apart), then the median over all rounds: the load
        # of a shared machine moves by 2-4x within minutes, much less
        # within one round.
        ratio = {s: statistics.median(a / b for grp in raw[t] for a, b in zip(grp[s], grp["torch"]))
                 for s in systems}
        summary[t] = {"median_samples_per_s": med, "ratio_vs_torch": ratio}
        print(f"\n{t}")
        for s in systems:
            print(f"  {s:12s} {med[s]:7.1f} samples/s  ratio vs torch {ratio[s]:.3f}")
    bu.record_result("one_rank_overhead", {
        "batch": a.batch, "warmup": a.warmup, "steps": a.steps, "reps": a.reps, "groups": a.groups,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_start)),
        "load_start": load0, "load_end": os.getloadavg()[0],
        "raw": {bu.portable_path(t): v for t, v in raw.items()},
        "summary": {bu.portable_path(t): v for t, v in summary.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
