#!/usr/bin/env python
"""CSC's CPU cost per call (`seconds_sparse` in gradflow.stats(): importance,
select, pack, unpack), for one tensor size and ratio on 2 ranks, optionally
for two gradflow trees side by side (e.g. before and after a change to
native/sparse_chunks.cc), alternating process groups so both see the same
machine. Writes benchmarks/results/csc_cpu_cost.json (--mode tensor) or
csc_cpu_cost_pool.json (--mode pool).

--mode tensor: a named `gradflow.allreduce(..., sparse_ratio=)` of --elems
float32 (the classic residual). --mode pool: the torch DistributedOptimizer
(pool path) training benchmarks/_trainbench.py's 25.2 M-parameter MLP with
sparse_ratio; reports seconds_sparse per step and rank and the median step
time (zero_grad + forward + backward + step), which also carries the
optimizer-side passes outside seconds_sparse (zero_grad of the pool).

    python benchmarks/csc_cpu_cost.py                          # this tree
    python benchmarks/csc_cpu_cost.py --trees /path/old-tree .  # compare (each built in place)
    python benchmarks/csc_cpu_cost.py --mode pool --trees /path/old-tree .
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _benchutil as bu  # noqa: E402


def worker(elems: int, ratio: float, iters: int, out: str) -> None:
    import numpy as np
    import gradflow as gf
    gf.init()
    rng = np.random.default_rng(gf.rank())
    x = rng.standard_normal(elems).astype(np.float32)
    for _ in range(3):  # warm-up: residual allocated, pages touched
        gf.allreduce(x.copy(), name="csc", sparse_ratio=ratio)
    gf.reset_stats()
    for _ in range(iters):
        gf.allreduce(x.copy(), name="csc", sparse_ratio=ratio)
    s = gf.stats()
    if gf.rank() == 0:
        with open(out, "w") as f:
            json.dump({"seconds_sparse_per_call": s.get("seconds_sparse", 0.0) / iters,
                       "sparse_steps": s.get("sparse.steps", 0.0)}, f)
    gf.shutdown()


def pool_worker(ratio: float, iters: int, out: str) -> None:
    import time
    import torch
    import torch.nn.functional as F
    import gradflow as gf
    import gradflow.torch as hvd
    from _trainbench import WideMLP
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = WideMLP()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters(), sparse_ratio=ratio)
    x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    from gradflow import _native
    for _ in range(int(_native.config()["sparse_warmup_steps"]) + 3):  # copy path, pool build, warm-up
        step()
    gf.reset_stats()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    s = gf.stats()
    if gf.rank() == 0:
        with open(out, "w") as f:
            json.dump({"seconds_sparse_per_call": s.get("seconds_sparse", 0.0) / iters,
                       "step_seconds_median": statistics.median(times),
                       "sparse_steps": s.get("sparse.steps", 0.0),
                       "dense_warmup_steps": s.get("sparse.dense_warmup_steps", 0.0)}, f)
    gf.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", default=[bu.ROOT], help="gradflow source trees (built in place)")
    p.add_argument("--elems", type=int, default=16 << 20, help="float32 elements (default 16 Mi = 64 MiB)")
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--mode", choices=("tensor", "pool"), default="tensor")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--pool-worker", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(int(a.worker[0]), float(a.worker[1]), int(a.worker[2]), a.worker[3])
        return 0
    if a.pool_worker:
        pool_worker(float(a.pool_worker[0]), int(a.pool_worker[1]), a.pool_worker[2])
        return 0
    trees = [os.path.abspath(t) for t in a.trees]
    res = {t: [] for t in trees}
    steps = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as d:
        for g in range(a.groups):
            for t in trees:
                env = bu.base_env(2)
                out = os.path.join(d, f"{g}-{len(res[t])}.json")
                env["PYTHONPATH"] = os.pathsep.join([t, HERE])
                args = (["--worker", str(a.elems)] if a.mode == "tensor" else ["--pool-worker"]) + [
                    str(a.ratio), str(a.iters), out]
                cmd = bu.launcher_prefix(2) + [sys.executable, os.path.abspath(__file__)] + args
                subprocess.run(cmd, env=env, check=True, timeout=900, cwd=d)
                with open(out) as f:
                    r = json.load(f)
                if a.mode == "tensor":
                    assert r["sparse_steps"] == a.iters, r  # every timed call really ran CSC
                else:  # every timed step sparse (one per bucket), none a dense warm-up
                    assert r["sparse_steps"] >= a.iters and r["dense_warmup_steps"] == 0, r
                    steps[t].append(r["step_seconds_median"])
                res[t].append(r["seconds_sparse_per_call"])
                extra = f", step {steps[t][-1] * 1e3:.1f} ms" if steps[t] else ""
                print(f"group {g + 1}/{a.groups} {t}: {res[t][-1] * 1e3:.2f} ms sparse per "
                      f"{'call' if a.mode == 'tensor' else 'step'}{extra}", flush=True)
    med = {t: statistics.median(v) for t, v in res.items()}
    what = f"{a.elems} float32" if a.mode == "tensor" else "25.2 M-parameter MLP, pool path"
    for t in trees:
        extra = f", step median {statistics.median(steps[t]) * 1e3:.1f} ms" if steps[t] else ""
        print(f"{t}: median {med[t] * 1e3:.2f} ms per {'call' if a.mode == 'tensor' else 'step'} "
              f"({what}, ratio {a.ratio}){extra}")
    if len(trees) == 2:
        print(f"ratio second/first: {med[trees[1]] / med[trees[0]]:.2f}")
    name = "csc_cpu_cost" if a.mode == "tensor" else "csc_cpu_cost_pool"
    portable = lambda d: {bu.portable_path(t): v for t, v in d.items()}  # noqa: E731
    bu.record_result(name, {"mode": a.mode, "elems": a.elems if a.mode == "tensor" else None,
                            "ratio": a.ratio, "iters": a.iters,
                            "seconds_per_call": portable(res), "median": portable(med),
                            "step_seconds": portable(steps), "load": os.getloadavg()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
