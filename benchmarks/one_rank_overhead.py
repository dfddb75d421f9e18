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
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _benchutil as bu  # noqa: E402
import _one_rank as one_rank  # noqa: E402

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
        for system in bu.rotated(names, r):
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
    one_rank.add_args(p, MODES, modes_help=None,
                      warmup_help="steps per mode before timing (pool build, dense CSC warm-up)")
    a = p.parse_args()
    if one_rank.run_worker_if_asked(a, worker):
        return 0
    load0, t_start = os.getloadavg()[0], time.time()
    records = one_rank.run_groups(__file__, a, timeout=1200)
    trees = list(records)
    raw: Dict[str, List[one_rank.Runs]] = one_rank.field(records, "samples_per_s")
    summary = {}
    for t in trees:
        systems = raw[t][0].keys()
        med = one_rank.pooled_median(raw[t])
        # Paired: each repetition's samples/s over plain torch's in the same round.
        ratio = one_rank.paired_median_ratio(raw[t], "torch")
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
