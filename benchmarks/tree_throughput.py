#!/usr/bin/env python
"""Training throughput of two (or more) gradflow trees, e.g. before and after
a change, on N ranks over shared memory, in interleaved rounds (issue 15:
"non-elastic jobs keep today's speed, benchmark before and after").

    python benchmarks/tree_throughput.py --trees /path/to/before . --ranks 2 --rounds 6

Each tree must be built in place (`python setup.py build_ext --inplace` with
this interpreter). One round runs every tree once, each its own process
group (_traindriver.run_group, PYTHONPATH = that tree; the worker is this
tree's benchmarks/_trainbench.py, so both sides run the same model and
protocol); the order of the trees alternates between rounds. A tree's
ratio is the median over rounds of its throughput over the first tree's in
the same round (a minute apart): the load of a shared machine moves by
2-4x within minutes, much less within one round.
Writes benchmarks/results/tree_throughput.json (every round).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402
import _traindriver as td  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", required=True, help="gradflow source trees, built in place; "
                   "the first is the reference")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--systems", default="gf-pool,gf-copy")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--timeout", type=float, default=600, help="seconds per system and group")
    a = p.parse_args()
    trees = [os.path.abspath(t) for t in a.trees]
    for t in trees:
        if not any(f.startswith("_native") for f in os.listdir(os.path.join(t, "gradflow"))):
            p.error(f"{t}: no gradflow/_native* (build it in place first)")
    systems = [s for s in a.systems.split(",") if s]
    wargs = ["--batch", str(a.batch), "--warmup", str(a.warmup), "--steps", str(a.steps),
             "--reps", str(a.reps)]
    # tput[tree][system] = throughput per round (None where the group failed)
    tput: Dict[str, Dict[str, List[object]]] = {t: {s: [] for s in systems} for t in trees}
    loads: List[float] = []
    t_start, load0 = time.time(), os.getloadavg()[0]
    for rnd in range(a.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for t in order:
            print(f"round {rnd + 1}/{a.rounds}: {t} (load {os.getloadavg()[0]:.1f})", flush=True)
            res = td.run_group(systems, "mlp", a.ranks, "local", wargs, {"PYTHONPATH": t},
                               a.timeout)
            for s in systems:
                tput[t][s].append(res.get(s, {}).get("throughput"))
            loads.append(os.getloadavg()[0])
    summary: Dict[str, Dict[str, Dict[str, float]]] = {}
    ref = trees[0]
    print(f"\n{a.ranks} ranks, shared memory, batch {a.batch}/rank, {a.rounds} rounds, "
          f"load {min(loads):.1f}-{max(loads):.1f} (1-min average after each group)")
    for t in trees:
        summary[t] = {}
        for s in systems:
            pairs = [(x, r) for x, r in zip(tput[t][s], tput[ref][s]) if x and r]
            if not pairs:
                print(f"  {t} {s}: no successful round")
                continue
            ratios = [x / r for x, r in pairs]
            summary[t][s] = {"median_samples_per_s": statistics.median(x for x, _ in pairs),
                             "ratio_vs_first": statistics.median(ratios),
                             "ratio_min": min(ratios), "ratio_max": max(ratios)}
            print(f"  {s:8s} {t}: {summary[t][s]['median_samples_per_s']:7.1f} samples/s, "
                  f"ratio vs {os.path.basename(ref)} {statistics.median(ratios):.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
    bu.record_result("tree_throughput", {
        "args": {k: ([bu.portable_path(os.path.abspath(t)) for t in v] if k == "trees" else v)
                 for k, v in vars(a).items()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_start)),
        "load_start": load0, "loads": loads, "throughput": {bu.portable_path(t): v for t, v in tput.items()},
        "summary": {bu.portable_path(t): v for t, v in summary.items()},
        "machine": bu.machine_info()})
    return 0 if all(summary[t] for t in trees) else 1


if __name__ == "__main__":
    sys.exit(main())
