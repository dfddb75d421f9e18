#!/usr/bin/env python
"""What the presence Sum of Note [None on some ranks] (gradflow/missing_gradients.py)
costs a Keras step run eagerly: the Keras torch backend, or the TensorFlow
backend with run_eagerly=True. Each eager step first sums, in one small
allreduce, which ranks have which gradient. Here two identical models train
on the same data per rank (an MLP 32-32-32-32-32-4, batch 32, SGD, 40 steps
per repetition), one with the Sum and one with it replaced by the identity
(equal results: every gradient exists on every rank); their repetitions
alternate and each system's median milliseconds per step is reported. Small
on purpose: a short step shows the fixed per-step cost.

    mpiexec -n 2 python benchmarks/keras_presence_cost.py --backend torch --reps 21
    mpiexec -n 2 python benchmarks/keras_presence_cost.py --backend tensorflow --reps 21

Prints one line per system and the ratio on rank 0; writes every repetition
to benchmarks/results/keras_presence_cost-<backend>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--backend", choices=("torch", "tensorflow"), default="torch")
parser.add_argument("--reps", type=int, default=21)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()
os.environ["KERAS_BACKEND"] = args.backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import gradflow.keras as hvd  # noqa: E402
import gradflow.keras.optimizer as keras_optimizer  # noqa: E402

hvd.init()
R = hvd.rank()
WITH_SUM = keras_optimizer.zeros_where_others_have_gradients
x = np.random.default_rng(R).normal(size=(32 * args.steps, 32)).astype(np.float32)
y = x[:, :4].copy()


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((32,))] +
                         [keras.layers.Dense(32, activation="relu") for _ in range(4)] +
                         [keras.layers.Dense(4)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
              run_eagerly=True)
    return m


systems = {"with the presence Sum": model(), "without (identity)": model()}
for m in systems.values():  # warm-up: builds, first negotiations
    m.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0, shuffle=False)
runs = {k: [] for k in systems}
for rep in range(args.reps):
    for name, m in systems.items():
        keras_optimizer.zeros_where_others_have_gradients = (
            WITH_SUM if name.startswith("with ") else (lambda grads, *a, **kw: list(grads)))
        hvd.allreduce(np.zeros(1, np.float32), name="keras_presence_cost.sync")
        t0 = time.perf_counter()
        m.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        runs[name].append((time.perf_counter() - t0) / args.steps * 1e3)
keras_optimizer.zeros_where_others_have_gradients = WITH_SUM
a, b = (systems[k].get_weights() for k in systems)
assert all(np.array_equal(u, v) for u, v in zip(a, b)), "the two systems trained differently"
if R == 0:
    med = {k: float(np.median(v)) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{args.backend}, {hvd.size()} ranks, {k}: median {med[k]:.3f} ms/step "
              f"(runs {', '.join(f'{t:.2f}' for t in v)})")
    with_sum, without = med["with the presence Sum"], med["without (identity)"]
    print(f"cost of the Sum: {with_sum - without:+.3f} ms/step; step time without/with = "
          f"{without / with_sum:.3f}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       f"keras_presence_cost-{args.backend}.json")
    with open(out, "w") as f:
        json.dump({"backend": args.backend, "ranks": hvd.size(), "steps": args.steps,
                   "ms_per_step": runs, "median": med,
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1)
sys.exit(0)
