"""Keras worker of the training benchmarks (scaling.py's keras rows, issue 16
target 4): training-step throughput of the WideMLP (1024-4096-4096-1024-10,
the torch benchmark's model) written in Keras 3 on the TensorFlow backend.

    python benchmarks/_kerasbench.py --systems keras-fp32,keras-fp32-seq --model mlp --json-out R.json

Systems (one family per process group, as _trainbench.py):
  keras           one process, plain Keras, no gradflow (the Keras baseline)
  keras-fp32      gradflow.keras DistributedOptimizer, dense fp32 wire, gradient
                  reduction overlapped with backward (submit/wait nodes)
  keras-fp32-seq  the same optimizer, GRADFLOW_TF_OVERLAP=0 when traced: one
                  crossing after the whole backward (the behaviour before issue 16)
  keras-all       fp16 wire + CSC sparse_ratio=0.01, overlapped
  keras-all-seq   the same, not overlapped

The step is a compiled train step (tf.function, jit_compile=False): forward,
tape.gradient, `optimizer.apply` (the wrapper reduces in apply()). An `-seq`
system shares the model and optimizer of its overlapped twin (two traces of
the same step, one per GRADFLOW_TF_OVERLAP value), and their repetitions are
interleaved (on, off, on, off, ...) so the two are measured under the same
load. Threads per rank: TF intra-op 1 (one core for a matmul, as the torch
rows' 1 torch thread), inter-op 2 (independent nodes, e.g. a submit and a
matmul, may run side by side). Protocol and output records as _trainbench.py.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _trainworker as tw  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"

SYSTEMS = {  # name: (DistributedOptimizer keywords or None for plain Keras, overlap)
    "keras": (None, True),
    "keras-fp32": ({}, True),
    "keras-fp32-seq": ({}, False),
    "keras-all": ({"compression": "fp16", "sparse_ratio": 0.01}, True),
    "keras-all-seq": ({"compression": "fp16", "sparse_ratio": 0.01}, False),
}
WIDTHS = (1024, 4096, 4096, 1024, 10)


def traced_train_step(model, opt, loss_fn, x, y, overlap_on: bool):
    """The compiled train step (forward, tape.gradient, opt.apply), traced now
    with GRADFLOW_TF_OVERLAP as `overlap_on` says: the setting is read when
    the step is traced. jit_compile=False: gradflow's host callbacks cannot
    run under XLA. Shared with tf_overlap_probe.py."""
    import tensorflow as tf

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss
    fn = tf.function(train_step, jit_compile=False)
    os.environ["GRADFLOW_TF_OVERLAP"] = "1" if overlap_on else "0"
    fn.get_concrete_function(x, y)  # trace now, under this setting
    return fn


def _base(system: str) -> str:
    return system[:-len("-seq")] if system.endswith("-seq") else system


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", required=True)
    p.add_argument("--model", default="mlp", choices=["mlp"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads")
    p.add_argument("--json-out", required=True)
    a = p.parse_args(argv)
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s}; known: {', '.join(SYSTEMS)}")
    plain = {SYSTEMS[s][0] is None for s in systems}
    if len(plain) != 1:
        raise SystemExit("--systems: the plain 'keras' baseline runs alone (one process, no MPI)")
    plain = plain.pop()

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    t_init = time.perf_counter()
    gf = hvd = None
    if plain:
        rank, size = 0, 1
        barrier, max_all = tw.step_timing()
    else:
        import gradflow
        import gradflow.keras as hvd
        from gradflow.keras.callbacks import broadcast_keras_variables
        from gradflow.tensorflow import overlap
        from mpi4py import MPI
        hvd.init()
        gf = gradflow
        rank, size = hvd.rank(), hvd.size()
        barrier, max_all = tw.step_timing(MPI.COMM_WORLD)
    t_init = time.perf_counter() - t_init
    out = tw.train_worker_record(a, size, a.batch, t_init)

    bases = []
    for s in systems:
        if _base(s) not in bases:
            bases.append(_base(s))
    for base in bases:
        members = [s for s in systems if _base(s) == base]
        out["current"] = members[0]
        if rank == 0:
            tw.write_json_atomic(a.json_out, out)
            print(f"[worker] {', '.join(members)}: {size} rank(s), model {a.model}", flush=True)
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((WIDTHS[0],))] + [
            keras.layers.Dense(w, activation="relu" if i < len(WIDTHS) - 2 else None)
            for i, w in enumerate(WIDTHS[1:])])
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        kw = SYSTEMS[members[0]][0]
        if kw is not None:
            kw = dict(kw)
            if kw.get("compression") == "fp16":
                kw["compression"] = hvd.Compression.fp16
            opt = hvd.DistributedOptimizer(opt, name=f"kerasbench.{base}", **kw)
            broadcast_keras_variables(model.variables, 0, "bench.init")
        opt.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        rng = np.random.default_rng(rank)
        x = tf.constant(rng.standard_normal((a.batch, WIDTHS[0])).astype(np.float32))
        y = tf.constant(rng.integers(0, 10, a.batch).astype(np.int32))

        steps = {s: traced_train_step(model, opt, loss_fn, x, y, SYSTEMS[s][1]) for s in members}
        os.environ.pop("GRADFLOW_TF_OVERLAP", None)
        rec = {s: {"system": s, "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                   "rep_seconds": [], "bytes": 0.0, "nic": 0} for s in members}
        barrier()
        t0 = time.perf_counter()
        for s in members:
            for _ in range(a.warmup):
                steps[s](x, y)
        barrier()
        for s in members:
            rec[s]["warmup_seconds"] = time.perf_counter() - t0
        for _ in range(a.reps):
            for s in members:  # interleaved: on, off, on, off, ...
                st0 = gf.stats().get("bytes_sent", 0.0) if gf else 0.0
                tx0 = tw.nic_tx_bytes()
                barrier()
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    steps[s](x, y)
                rec[s]["rep_seconds"].append(max_all(time.perf_counter() - t0))
                rec[s]["bytes"] += (gf.stats().get("bytes_sent", 0.0) - st0) if gf else 0.0
                tx1 = tw.nic_tx_bytes()
                if tx0 is not None:
                    rec[s]["nic"] += tx1 - tx0
        nsteps = a.reps * a.steps
        checksum = float(sum(np.asarray(v, np.float64).sum() for v in model.trainable_variables))
        spread = max_all(checksum) + max_all(-checksum)
        for s in members:
            r = rec[s]
            times = r["rep_seconds"]
            r.update(tw.throughput_fields(times, size, a.batch, a.steps))
            if tw.nic_tx_bytes() is not None:
                r["nic_tx_bytes_per_step"] = max_all(r["nic"] / nsteps)
            if gf is not None:
                r["bytes_sent_per_step"] = r["bytes"] / nsteps
                r["overlapped_submits"] = overlap.overlapped_submits()
            r["param_checksum_spread"] = spread
            del r["bytes"], r["nic"]
            out["results"][s] = r
            if rank == 0:
                print(f"[worker] {s}: {r['throughput']:.1f} samples/s", flush=True)
        del steps, opt, model
        gc.collect()
    out["current"] = None
    if rank == 0:
        tw.write_json_atomic(a.json_out, out)
    if gf is not None:
        hvd.shutdown()


if __name__ == "__main__":
    main()
