#!/usr/bin/env python
"""Does TensorFlow's gradient reduction overlap with backward? (issue 16 target 4)

    mpiexec -n 2 python benchmarks/tf_overlap_probe.py [--steps 6] [--batch 32]

Runs the WideMLP (1024-4096-4096-1024-10, Keras 3, TF backend) compiled train
step with gradflow.keras.DistributedOptimizer, once traced with the overlapped
reduction (submit/wait nodes) and once with GRADFLOW_TF_OVERLAP=0, steps
interleaved. On every step it records, on this process's clock:
  mark   when backward reaches the first Dense layer's output (an identity
         layer whose gradient is a host callback that stores the time): the
         first layer's kernel and bias gradients, the last ones backward
         computes, are only computed after this
  submit the time of every gradient allreduce submitted to the core
  end    when the step returns
and prints, per step and rank, (first submit - mark) and (last submit - mark)
in ms: negative = submitted before backward reached the first layer, i.e.
during backward. Timings are this machine's, not a unit test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
import keras  # noqa: E402

import gradflow.keras as hvd  # noqa: E402
from gradflow.keras.callbacks import broadcast_keras_variables  # noqa: E402
from gradflow.tensorflow import ops as tf_ops  # noqa: E402
from gradflow.tensorflow import overlap  # noqa: E402
from _kerasbench import WIDTHS, traced_train_step  # noqa: E402  (the benchmark's model and step)

_marks: list = []
_submits: list = []


class _Recording:
    """Stands in for gradflow.collectives inside the TF binding: stores the
    time of each allreduce_async call, then forwards it."""

    def __init__(self, inner):
        self._inner = inner

    def allreduce_async(self, *args, **kwargs):
        _submits.append(time.perf_counter())
        return self._inner.allreduce_async(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class BackwardMark(keras.layers.Layer):
    """Identity; its gradient stores the time backward passes through it. Not
    stateful, so it is not chained with gradflow's nodes (see overlap.py)."""

    def call(self, x):
        @tf.custom_gradient
        def ident(v):
            def grad(dy):
                def stamp(a):
                    _marks.append(time.perf_counter())
                    return a
                out = tf.numpy_function(stamp, [dy], dy.dtype, stateful=False)
                out.set_shape(dy.shape)
                return out
            return tf.identity(v), grad
        return ident(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json-out", default=None)
    a = p.parse_args()
    hvd.init()
    rank = hvd.rank()
    overlap._c = _Recording(overlap._c)
    tf_ops._c = _Recording(tf_ops._c)
    keras.utils.set_random_seed(0)
    layers = [keras.Input((WIDTHS[0],)), keras.layers.Dense(WIDTHS[1], activation="relu"), BackwardMark()]
    layers += [keras.layers.Dense(w, activation="relu" if i < len(WIDTHS) - 3 else None)
               for i, w in enumerate(WIDTHS[2:])]
    model = keras.Sequential(layers)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), name="probe")
    opt.build(model.trainable_variables)
    broadcast_keras_variables(model.variables, 0, "bench.init")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.standard_normal((a.batch, WIDTHS[0])).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, a.batch).astype(np.int32))

    fns = {"overlapped": traced_train_step(model, opt, loss_fn, x, y, True),
           "not overlapped": traced_train_step(model, opt, loss_fn, x, y, False)}
    rows = {k: [] for k in fns}
    for i in range(a.warmup + a.steps):
        for kind, fn in fns.items():
            del _marks[:], _submits[:]
            t0 = time.perf_counter()
            fn(x, y)
            t_end = time.perf_counter()
            if i >= a.warmup:
                m = _marks[0]
                rows[kind].append({"first_submit_minus_mark_ms": (min(_submits) - m) * 1e3,
                                   "last_submit_minus_mark_ms": (max(_submits) - m) * 1e3,
                                   "mark_ms": (m - t0) * 1e3, "step_ms": (t_end - t0) * 1e3,
                                   "submits": len(_submits)})
    summary = {}
    for kind, rs in rows.items():
        summary[kind] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"rank {rank} {kind:15s}: median over {len(rs)} steps: first submit - mark "
              f"{summary[kind]['first_submit_minus_mark_ms']:+.1f} ms, last submit - mark "
              f"{summary[kind]['last_submit_minus_mark_ms']:+.1f} ms, mark at "
              f"{summary[kind]['mark_ms']:.1f} ms, step {summary[kind]['step_ms']:.1f} ms; raw "
              f"first-mark: {', '.join('%+.1f' % r['first_submit_minus_mark_ms'] for r in rs)}",
              flush=True)
    if a.json_out and rank == 0:
        with open(a.json_out, "w") as f:
            json.dump({"rows": rows, "summary": summary, "loadavg": os.getloadavg(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
