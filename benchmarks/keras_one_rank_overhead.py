#!/usr/bin/env python
"""What one rank pays for gradflow with Keras on the TensorFlow backend (issue
16, target 2 for Keras: every mode >= 0.97 x plain Keras at N = 1). The Keras
twin of one_rank_overhead.py: one process under `mpiexec -n 1` trains the
WideMLP of _kerasbench.py (1024-4096-4096-1024-10, 25.2 M parameters, batch
32, SGD with momentum, a compiled train step: forward, tape.gradient,
optimizer.apply) with plain Keras and with each gradflow mode, each on its
own model, and interleaves their timed repetitions (the order rotates every
round); a mode's ratio is the median over rounds of its samples/s over plain
Keras's in the same round.

    python benchmarks/keras_one_rank_overhead.py                       # this tree
    python benchmarks/keras_one_rank_overhead.py --trees /old/tree .   # compare
    python benchmarks/keras_one_rank_overhead.py --modes gf-fp32,probe-copy --reps 10

Modes: gf-fp32 (DistributedOptimizer, dense, overlapped submit/wait nodes),
gf-fp32-seq (GRADFLOW_TF_OVERLAP=0 when traced: one crossing after
backward), gf-fp16 (16-bit wire), gf-csc0.01, gf-all (fp16 + CSC 0.01),
gf-tape (DistributedGradientTape + the plain optimizer). Probes, which
locate the one-rank cost of a tree without a fast path (no gradflow call):
probe-view (each gradient through an identity tf.numpy_function returning
its input: the host-callback crossing alone) and probe-copy (the same
returning a fresh copy, as the core's result array: crossing + 100 MB of
fresh memory written per step).

Writes benchmarks/results/keras_one_rank_overhead.json (every repetition).
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

MODES = ["gf-fp32", "gf-fp32-seq", "gf-fp16", "gf-csc0.01", "gf-all", "gf-tape"]
PROBES = ["probe-view", "probe-copy"]
WIDTHS = (1024, 4096, 4096, 1024, 10)  # _kerasbench.py's WideMLP


def worker(modes: List[str], batch: int, warmup: int, steps: int, reps: int, out: str) -> None:
    """Train plain Keras and every mode side by side; write samples/s per repetition."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras
    import gradflow
    import gradflow.keras as hvd
    import gradflow.tensorflow as gtf
    hvd.init()
    assert hvd.size() == 1, "run with one rank"
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, WIDTHS[0])).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kwargs = {"gf-fp32": {}, "gf-fp32-seq": {}, "gf-fp16": {"compression": hvd.Compression.fp16},
              "gf-csc0.01": {"sparse_ratio": 0.01},
              "gf-all": {"compression": hvd.Compression.fp16, "sparse_ratio": 0.01}}

    def crossing(copy: bool):
        def through(g):
            out = tf.numpy_function((lambda a: np.array(a)) if copy else (lambda a: a), [g],
                                    g.dtype, stateful=True)
            out.set_shape(g.shape)
            return out
        return through

    def make(system: str):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((WIDTHS[0],))] + [
            keras.layers.Dense(w, activation="relu" if i < len(WIDTHS) - 2 else None)
            for i, w in enumerate(WIDTHS[1:])])
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if system in kwargs:
            opt = hvd.DistributedOptimizer(opt, name=f"bench.{system}", **kwargs[system])
        opt.build(model.trainable_variables)
        through = crossing(system == "probe-copy") if system.startswith("probe-") else None

        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            if system == "gf-tape":
                tape = gtf.DistributedGradientTape(tape, name="bench.tape")
            grads = tape.gradient(loss, model.trainable_variables)
            if through is not None:
                grads = [through(g) for g in grads]
            opt.apply(grads, model.trainable_variables)
            return loss

        fn = tf.function(train_step, jit_compile=False)
        os.environ["GRADFLOW_TF_OVERLAP"] = "0" if system.endswith("-seq") else "1"
        fn.get_concrete_function(x, y)  # trace now, under this setting
        os.environ.pop("GRADFLOW_TF_OVERLAP")
        return fn

    runs = {system: make(system) for system in ["keras"] + modes}
    for system, fn in runs.items():
        for _ in range(warmup):
            fn(x, y)
    before = gradflow.stats().get("allreduce.count", 0.0)
    res: Dict[str, List[float]] = {s: [] for s in runs}
    cpu: Dict[str, List[float]] = {s: [] for s in runs}
    names = list(runs)
    for r in range(reps):
        for system in bu.rotated(names, r):
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                runs[system](x, y)
            res[system].append(batch * steps / (time.perf_counter() - t0))
            # CPU of every thread of the process (TF's, gradflow's loop):
            # what the step costs, less sensitive to other jobs than wall time
            cpu[system].append((time.process_time() - c0) / steps * 1e3)
    with open(out, "w") as f:
        json.dump({"samples_per_s": res, "cpu_ms_per_step": cpu,
                   "allreduces_while_timed": gradflow.stats().get("allreduce.count", 0.0) - before},
                  f)
    hvd.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    one_rank.add_args(p, MODES, modes_help=f"comma-separated; known: {','.join(MODES + PROBES)}",
                      warmup_help="steps per mode before timing")
    a = p.parse_args()
    if one_rank.run_worker_if_asked(a, worker):
        return 0
    unknown = [m for m in a.modes.split(",") if m and m not in MODES + PROBES]
    if unknown:
        p.error(f"unknown modes {unknown}; known: {', '.join(MODES + PROBES)}")
    load0, t_start = os.getloadavg()[0], time.time()
    records = one_rank.run_groups(__file__, a, timeout=1800)
    trees = list(records)
    raw: Dict[str, List[one_rank.Runs]] = one_rank.field(records, "samples_per_s")
    raw_cpu: Dict[str, List[one_rank.Runs]] = one_rank.field(records, "cpu_ms_per_step")
    sent: Dict[str, List[float]] = one_rank.field(records, "allreduces_while_timed")
    summary = {}
    for t in trees:
        systems = raw[t][0].keys()
        med = one_rank.pooled_median(raw[t])
        # Paired: each repetition's samples/s over plain Keras's in the same round.
        ratio = one_rank.paired_median_ratio(raw[t], "keras")
        cpu = one_rank.pooled_median(raw_cpu[t])
        summary[t] = {"median_samples_per_s": med, "ratio_vs_keras": ratio,
                      "median_cpu_ms_per_step": cpu, "allreduces_while_timed": sent[t]}
        print(f"\n{t}  (allreduces submitted while timed: {sent[t]})")
        for s in systems:
            print(f"  {s:12s} {med[s]:7.1f} samples/s  ratio vs keras {ratio[s]:.3f}  "
                  f"CPU {cpu[s]:6.1f} ms/step")
    bu.record_result("keras_one_rank_overhead", {
        "batch": a.batch, "warmup": a.warmup, "steps": a.steps, "reps": a.reps, "groups": a.groups,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_start)),
        "load_start": load0, "load_end": os.getloadavg()[0],
        "raw": {bu.portable_path(t): v for t, v in raw.items()},
        "raw_cpu_ms_per_step": {bu.portable_path(t): v for t, v in raw_cpu.items()},
        "summary": {bu.portable_path(t): v for t, v in summary.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
