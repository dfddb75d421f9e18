#!/usr/bin/env python
"""What the presence Sum of Note [None on some ranks] (gradflow/missing_gradients.py)
costs a Keras step run eagerly: the Keras torch backend, or the TensorFlow
backend with run_eagerly=True. Each eager step sums, in one small allreduce,
which ranks have which gradient. Three identical models train on the same
data per rank (an MLP 32-32-32-32-32-4, batch 32, SGD, 40 steps per
repetition, no shuffling): "with the gradients" (the code as it is: on the
torch backend the Sum is submitted together with the gradients), "before the
gradients" (the Sum waited for before any gradient is submitted: the
TensorFlow eager path, and the torch path before 2026-11-27) and "no Sum"
(presence not checked: the same numbers here, since every gradient exists on
every rank; the script asserts equal weights). Their repetitions alternate;
each system's median milliseconds per step is reported. Small on purpose: a
short step shows the fixed per-step cost.

    mpiexec -n 2 python benchmarks/keras_presence_cost.py --backend torch --reps 21
    mpiexec -n 2 python benchmarks/keras_presence_cost.py --backend tensorflow --reps 21

Prints one line per system on rank 0; writes every repetition to
benchmarks/results/keras_presence_cost-<backend>.json.
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
REDUCE = keras_optimizer._reduce_eager_numpy
PRESENCE = keras_optimizer._DistributedMixin._gradflow_presence
x = np.random.default_rng(R).normal(size=(32 * args.steps, 32)).astype(np.float32)
y = x[:, :4].copy()


def reduce_after_a_waited_sum(grads, names, opt, presence=None):
    """The torch path before 2026-11-27: the Sum waited for, then the gradients."""
    if presence is not None:
        grads = keras_optimizer.zeros_where_others_have_gradients(
            grads, presence[0], presence[1], f"{opt.gradflow_name}.has_gradient", opt.process_set)
    return REDUCE(grads, names, opt, None)


SETUPS = {  # system -> (_reduce_eager_numpy, _gradflow_presence)
    "with the gradients": (REDUCE, PRESENCE),
    "before the gradients": (reduce_after_a_waited_sum, PRESENCE),
    "no Sum": (REDUCE, lambda self, grads, variables=None: None),
}
if args.backend == "tensorflow":  # one eager path there: the Sum before the gradients
    del SETUPS["with the gradients"]


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((32,))] +
                         [keras.layers.Dense(32, activation="relu") for _ in range(4)] +
                         [keras.layers.Dense(4)])
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
              run_eagerly=True)
    return m


def use(system):
    keras_optimizer._reduce_eager_numpy, keras_optimizer._DistributedMixin._gradflow_presence = \
        SETUPS[system]


systems = {k: model() for k in SETUPS}
for k, m in systems.items():  # warm-up: builds, first negotiations
    use(k)
    m.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0, shuffle=False)
runs = {k: [] for k in systems}
for rep in range(args.reps):
    for name, m in systems.items():
        use(name)
        hvd.allreduce(np.zeros(1, np.float32), name="keras_presence_cost.sync")
        t0 = time.perf_counter()
        m.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        runs[name].append((time.perf_counter() - t0) / args.steps * 1e3)
use("with the gradients" if "with the gradients" in SETUPS else "before the gradients")
weights = [m.get_weights() for m in systems.values()]
assert all(np.array_equal(u, v) for w in weights[1:] for u, v in zip(weights[0], w)), \
    "the systems trained differently"
if R == 0:
    med = {k: float(np.median(v)) for k, v in runs.items()}
    for k, v in runs.items():
        paired = float(np.median(np.subtract(v, runs["no Sum"])))
        print(f"{args.backend}, {hvd.size()} ranks, presence Sum {k}: median {med[k]:.3f} ms/step; "
              f"paired median difference to no Sum {paired:+.3f} ms "
              f"(runs {', '.join(f'{t:.2f}' for t in v)})")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       f"keras_presence_cost-{args.backend}.json")
    with open(out, "w") as f:
        json.dump({"backend": args.backend, "ranks": hvd.size(), "steps": args.steps,
                   "ms_per_step": runs, "median": med,
                   "paired_median_vs_no_sum": {k: float(np.median(np.subtract(v, runs["no Sum"]))) for k, v in runs.items()},
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, f, indent=1)
sys.exit(0)
