"""The driver side shared by the one-rank overhead benchmarks
(one_rank_overhead.py for torch, keras_one_rank_overhead.py for Keras): their
command line, the groups of one-rank process groups over several source
trees, and the paired medians that summarise the rounds.

Each benchmark is one script in two roles: the driver (no --worker) starts
`mpiexec -n 1 <script> --worker ...` per group and tree; the worker trains
every mode side by side, rounds rotated (_benchutil.rotated), and writes a
JSON record whose "samples_per_s" maps a mode to one value per round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import _benchutil as bu

Runs = Dict[str, List[float]]  # mode -> one measurement per round


def add_args(p: argparse.ArgumentParser, modes: Sequence[str], modes_help: Optional[str],
             warmup_help: str) -> None:
    """The common command line: trees, modes, step shape, rounds and groups,
    and the hidden --worker (its six values: see run_worker_if_asked)."""
    p.add_argument("--trees", nargs="+", default=[bu.ROOT], help="gradflow source trees (built in place)")
    p.add_argument("--modes", default=",".join(modes), help=modes_help)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8, help=warmup_help)
    p.add_argument("--steps", type=int, default=1, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=25, help="repetitions (rounds) per mode and group")
    p.add_argument("--groups", type=int, default=1, help="process groups per tree (alternating)")
    p.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)


def run_worker_if_asked(a: argparse.Namespace, worker) -> bool:
    """With --worker (this process is the rank a driver started): runs
    worker(modes, batch, warmup, steps, reps, out) from its six values and
    returns True; else False."""
    if not a.worker:
        return False
    w = a.worker
    worker([m for m in w[0].split(",") if m], int(w[1]), int(w[2]), int(w[3]), int(w[4]), w[5])
    return True


def run_groups(script: str, a: argparse.Namespace, timeout: float) -> Dict[str, List[dict]]:
    """`a.groups` rounds of one `mpiexec -n 1` process group per tree of
    a.trees (alternating trees), each running `script --worker` with the
    tree first on PYTHONPATH. Returns absolute tree path -> the groups' JSON
    records, in order."""
    trees = [os.path.abspath(t) for t in a.trees]
    records: Dict[str, List[dict]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as d:
        for g in range(a.groups):
            for t in trees:
                env = bu.base_env(1)
                env["PYTHONPATH"] = os.pathsep.join([t, bu.HERE])
                out = os.path.join(d, f"{g}-{len(records[t])}.json")
                cmd = bu.launcher_prefix(1) + [sys.executable, os.path.abspath(script), "--worker",
                                               a.modes, str(a.batch), str(a.warmup), str(a.steps),
                                               str(a.reps), out]
                subprocess.run(cmd, env=env, check=True, timeout=timeout, cwd=d)
                with open(out) as f:
                    records[t].append(json.load(f))
                print(f"group {g + 1}/{a.groups} {t}: done (load {os.getloadavg()[0]:.1f})", flush=True)
    return records


def field(records: Dict[str, List[dict]], key: str) -> Dict[str, list]:
    """tree -> its groups' values of `key` (run_groups' records, one field)."""
    return {t: [rec[key] for rec in recs] for t, recs in records.items()}


def pooled_median(groups: Sequence[Runs]) -> Dict[str, float]:
    """Per mode: the median of its measurements over every round of every group."""
    return {s: statistics.median(v for grp in groups for v in grp[s]) for s in groups[0]}


def paired_median_ratio(groups: Sequence[Runs], baseline: str) -> Dict[str, float]:
    """Per mode: the median over every round of every group of its
    measurement over `baseline`'s in the same round. Rounds are seconds
    apart: the load of a shared machine moves by 2-4x within minutes, much
    less within one round, so pairing first cancels most of it."""
    return {s: statistics.median(x / b for grp in groups for x, b in zip(grp[s], grp[baseline]))
            for s in groups[0]}
