#!/usr/bin/env python
"""What the timeline costs: the same small-allreduce loop with
GRADFLOW_TIMELINE off and on, in alternating process groups, reporting the
median time per allreduce of each. Off is the default; it costs one
`enabled()` branch per event site (native/timeline.h), so "on" bounds it.

    python benchmarks/timeline_cost.py               # 2 ranks, 4 KiB, 3 groups each
    python benchmarks/timeline_cost.py -np 2 --count 1024 --iters 2000 --groups 3

Each run writes benchmarks/results/timeline_cost.json; docs/performance.md
("Timeline cost") quotes it.
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


def worker(count: int, iters: int, out: str) -> None:
    import time
    import numpy as np
    import gradflow as gf
    gf.init()
    x = np.ones(count, np.float32)
    for _ in range(50):
        gf.allreduce(x, name="warm")
    gf.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        gf.allreduce(x, name="t")
    dt = (time.perf_counter() - t) / iters
    if gf.rank() == 0:
        with open(out, "w") as f:
            json.dump({"seconds_per_allreduce": dt}, f)
    gf.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("--count", type=int, default=1024, help="float32 elements (1024 = 4 KiB)")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--groups", type=int, default=3, help="process groups per setting")
    p.add_argument("--worker", nargs=2, metavar=("COUNT_ITERS", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        c, i = a.worker[0].split(",")
        worker(int(c), int(i), a.worker[1])
        return 0
    res = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as d:
        for g in range(a.groups):
            for mode in ("off", "on"):
                env = bu.base_env(a.np)
                if mode == "on":
                    env["GRADFLOW_TIMELINE"] = os.path.join(d, f"tl{g}.json")
                out = os.path.join(d, f"{mode}{g}.json")
                cmd = bu.launcher_prefix(a.np) + [sys.executable, os.path.abspath(__file__),
                       "--worker", f"{a.count},{a.iters}", out]
                subprocess.run(cmd, env=env, check=True, timeout=600)
                with open(out) as f:
                    res[mode].append(json.load(f)["seconds_per_allreduce"])
                print(f"group {g + 1}/{a.groups} {mode}: {res[mode][-1] * 1e6:.1f} us", flush=True)
    off, on = statistics.median(res["off"]), statistics.median(res["on"])
    print(f"{a.np} ranks, {a.count * 4} B allreduce x {a.iters}: timeline off {off * 1e6:.1f} us, "
          f"on {on * 1e6:.1f} us per allreduce (median of {a.groups} groups; on/off = {on / off:.2f})")
    bu.record_result("timeline_cost", {"ranks": a.np, "bytes": a.count * 4, "iters": a.iters,
                                       "seconds_per_allreduce": res, "median_off": off,
                                       "median_on": on, "on_over_off": on / off})
    return 0


if __name__ == "__main__":
    sys.exit(main())
