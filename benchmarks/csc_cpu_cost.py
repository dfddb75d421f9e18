#!/usr/bin/env python
"""CSC's CPU cost per call (`seconds_sparse` in gradflow.stats(): absorb,
select, pack, unpack), for one tensor size and ratio on 2 ranks, optionally
for two gradflow trees side by side (e.g. before and after a change to
native/sparse_chunks.cc), alternating process groups so both see the same
machine. Writes benchmarks/results/csc_cpu_cost.json.

    python benchmarks/csc_cpu_cost.py                          # this tree
    python benchmarks/csc_cpu_cost.py --trees /path/old-tree .  # compare (each built in place)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", default=[bu.ROOT], help="gradflow source trees (built in place)")
    p.add_argument("--elems", type=int, default=16 << 20, help="float32 elements (default 16 Mi = 64 MiB)")
    p.add_argument("--ratio", type=float, default=0.01)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(int(a.worker[0]), float(a.worker[1]), int(a.worker[2]), a.worker[3])
        return 0
    trees = [os.path.abspath(t) for t in a.trees]
    res = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as d:
        for g in range(a.groups):
            for t in trees:
                env = bu.base_env(2)
                env["PYTHONPATH"] = t
                out = os.path.join(d, f"{g}-{len(res[t])}.json")
                cmd = bu.launcher_prefix(2) + [
                    sys.executable, os.path.abspath(__file__), "--worker", str(a.elems), str(a.ratio),
                    str(a.iters), out]
                subprocess.run(cmd, env=env, check=True, timeout=900, cwd=d)
                with open(out) as f:
                    r = json.load(f)
                assert r["sparse_steps"] == a.iters, r  # every timed call really ran CSC
                res[t].append(r["seconds_sparse_per_call"])
                print(f"group {g + 1}/{a.groups} {t}: {res[t][-1] * 1e3:.2f} ms per call", flush=True)
    med = {t: statistics.median(v) for t, v in res.items()}
    for t in trees:
        print(f"{t}: median {med[t] * 1e3:.2f} ms per call ({a.elems} float32, ratio {a.ratio})")
    if len(trees) == 2:
        print(f"ratio second/first: {med[trees[1]] / med[trees[0]]:.2f}")
    bu.record_result("csc_cpu_cost", {"elems": a.elems, "ratio": a.ratio, "iters": a.iters,
                                      "seconds_per_call": {bu.portable_path(t): v for t, v in res.items()},
                                      "median": {bu.portable_path(t): v for t, v in med.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
