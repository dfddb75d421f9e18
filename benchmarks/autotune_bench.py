#!/usr/bin/env python
"""Autotune on the emulated 1 Gbit/s cluster (issue 16 target 7): autotune's
choice vs the defaults vs a sweep of fixed settings, interleaved in one run.

    sudo .venv/bin/python benchmarks/autotune_bench.py --models mlp,resnet --ranks 2

Per model, one MPI job of N ranks (one per emulated host, benchmarks/cluster,
namespaces gradflow-autotune<pid>-*) with GRADFLOW_AUTOTUNE=1:
  1. training from step 1 until the tuner is done (its wall time and step
     count are reported: that is what tuning costs);
  2. then, on the same model and optimizer, repetitions in which every point
     (defaults, the autotuned setting, each fixed setting of the sweep) is
     applied in turn (rotating order), one settling step is run and
     --steps steps are timed (slowest rank). A fixed setting is applied the
     way autotune applies one (the rank-0 broadcast the core executes, and
     pool_rebucket), so all points run in one process on one warm model:
     the comparison is interleaved, not across runs.
Throughput of a point = median over repetitions of N * batch * steps / time.
Models: benchmarks/_trainbench.py's mlp (25.2 M parameters) and resnet.
Prints a markdown table and writes JSON (--json-out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

# The sweep of fixed settings: algorithm x pool bucket MiB (ring piece 1 MiB,
# cycle 1 ms), plus ring piece sizes at the default bucket (none below the
# 1 MiB default: 256 KiB pieces deadlocked the MLP's ring on the emulated
# cluster, see gradflow/autotune_search.py).
SWEEP_ALGOS = ("ring", "two-sync", "mpi")
SWEEP_BUCKET_MIB = (2, 8, 32)
SWEEP_RING_PIECE_KIB = (2048, 4096)


def worker(a) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import gradflow
    import gradflow.torch as hvd
    from gradflow import _native
    from gradflow.autotune_search import Setting
    import _trainbench as tb

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    batch = a.batch or tb.DEFAULT_BATCH[a.model]
    cls, make_x = tb.MODELS[a.model]
    torch.manual_seed(0)
    model = cls()
    x, y = make_x(batch), torch.randint(0, 10, (batch,))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def slowest(v):
        return float(gradflow.allreduce(np.array([v]), op=gradflow.Max, name=None)[0])

    t0 = time.perf_counter()
    step()
    tuning_steps = 1
    tuner = opt._gradflow.autotuner
    while not tuner.done():
        step()
        tuning_steps += 1
    tuning_seconds = slowest(time.perf_counter() - t0)
    start, final = tuner.search.start, tuner.applied
    points = {"defaults": start, "autotune": final}
    for algo in SWEEP_ALGOS:
        for mib in SWEEP_BUCKET_MIB:
            points[f"{algo} {mib}MiB"] = Setting(algo, mib << 20, start.ring_pipeline_bytes,
                                                 start.cycle_time_ms)
    for kib in SWEEP_RING_PIECE_KIB:
        points[f"ring 8MiB piece{kib}K"] = Setting("ring", 8 << 20, kib << 10,
                                                   start.cycle_time_ms)
    applied = {"bucket": final.pool_bucket_bytes}
    counter = [0]

    def apply(s):
        counter[0] += 1
        gradflow.broadcast(np.array(s.encode(False)), 0, name=f"gradflow.autotune.bench{counter[0]}")
        if s.pool_bucket_bytes != applied["bucket"]:
            for pool in opt._gradflow.pools:
                _native.pool_rebucket(pool.id, s.pool_bucket_bytes)
            applied["bucket"] = s.pool_bucket_bytes

    names = list(points)
    times = {n: [] for n in names}
    for rep in range(a.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            apply(points[n])
            step()  # settle: new bucket names negotiate
            gradflow.barrier()
            t = time.perf_counter()
            for _ in range(a.steps):
                step()
            times[n].append(slowest(time.perf_counter() - t))
    if rank == 0:
        out = {"model": a.model, "ranks": size, "batch_per_rank": batch, "steps": a.steps,
               "reps": a.reps, "tuning_steps": tuning_steps, "tuning_seconds": tuning_seconds,
               "env": {k: v for k, v in os.environ.items() if k.startswith("GRADFLOW_")},
               "points": {n: {"setting": dataclasses.asdict(points[n]),
                              "rep_seconds": times[n],
                              "samples_per_s": [size * batch * a.steps / t for t in times[n]]}
                          for n in names},
               "samples": [[s.index, s.phase, s.setting.allreduce_algo,
                            s.setting.pool_bucket_bytes, s.setting.ring_pipeline_bytes,
                            s.setting.cycle_time_ms, s.seconds] for s in tuner.search.samples]}
        for p in out["points"].values():
            p["throughput"] = statistics.median(p["samples_per_s"])
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    hvd.shutdown()


def table(r) -> str:
    pts = r["points"]
    fixed = {n: p for n, p in pts.items() if n not in ("autotune",)}
    best = max(fixed, key=lambda n: fixed[n]["throughput"])
    d, t, b = pts["defaults"]["throughput"], pts["autotune"]["throughput"], pts[best]["throughput"]
    s = pts["autotune"]["setting"]
    lines = [f"**{r['model']}, N = {r['ranks']}** (batch {r['batch_per_rank']}/rank, "
             f"{r['steps']} steps x {r['reps']} reps per point): tuning took "
             f"{r['tuning_steps']} steps, {r['tuning_seconds']:.1f} s; autotune chose "
             f"{s['allreduce_algo']}, bucket {s['pool_bucket_bytes'] / 2**20:g} MiB, ring piece "
             f"{s['ring_pipeline_bytes'] >> 10} KiB, cycle {s['cycle_time_ms']:g} ms. "
             f"autotune / defaults = {t / d:.3f}, autotune / best fixed ({best}) = {t / b:.3f}.",
             "", "| point | samples/s (median) | reps |", "|---|---|---|"]
    for n, p in sorted(pts.items(), key=lambda kv: -kv[1]["throughput"]):
        lines.append(f"| {n} | {p['throughput']:.1f} | "
                     f"{', '.join(f'{v:.1f}' for v in p['samples_per_s'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp")
    p.add_argument("--models", default="mlp,resnet")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=3, help="timed steps per point and repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps-per-sample", type=int, default=2,
                   help="GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE for the tuning phase")
    p.add_argument("--warmup-samples", type=int, default=1)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0")
    p.add_argument("--timeout", type=float, default=1500)
    p.add_argument("--json-out", default=os.path.join(HERE, "results", "autotune.json"))
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    from cluster import Cluster
    os.makedirs(os.path.dirname(a.json_out), exist_ok=True)
    cluster = Cluster(a.ranks, a.rate, a.delay, name=f"autotune{os.getpid()}")
    cluster.up()
    results = []
    try:
        for model in a.models.split(","):
            out = f"{a.json_out[:-5]}-{model}.json"
            env = {**os.environ, "GRADFLOW_AUTOTUNE": "1",
                   "GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE": str(a.steps_per_sample),
                   "GRADFLOW_AUTOTUNE_WARMUP_SAMPLES": str(a.warmup_samples),
                   "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
            print(f"[autotune] {model}, N={a.ranks}, load {os.getloadavg()[0]:.2f}", flush=True)
            argv = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
                    "--steps", str(a.steps), "--reps", str(a.reps), "--json-out", out]
            if a.batch:
                argv += ["--batch", str(a.batch)]
            r = cluster.run(argv, n=a.ranks, timeout=a.timeout, env=env)
            with open(f"{out[:-5]}.log", "w", encoding="utf-8") as f:
                f.write(r.stdout + r.stderr)
            if r.returncode != 0:
                print(r.stdout[-3000:], r.stderr[-3000:])
                raise SystemExit(f"worker failed for {model}")
            with open(out, encoding="utf-8") as f:
                res = json.load(f)
            res["load_after"] = os.getloadavg()
            results.append(res)
            print(table(res), flush=True)
    finally:
        cluster.down()
    with open(a.json_out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
