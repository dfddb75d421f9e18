#!/usr/bin/env python
"""What the Keras DistributedOptimizer's hyperparameter check
(gradflow/keras/hyperparameter_check.py) costs a `model.fit` step on the
TensorFlow backend. Every round the traced step hands the learning rate to
the first submit node, which folds the values into a CRC; every 16th round's
allreduces carry it as their step tag, so that round and the next miss the
response cache and negotiate through rank 0 (native Note [Step tags]).

One model, one `fit`; blocks of 64 batches alternate between the check as
shipped (CHECK_EVERY = 16) and no tagged round (CHECK_EVERY so large that
no round is tagged; the learning rate still flows and the CRC is still
folded, so that cost is measured separately, in one process). Every rank
switches at the same batch. Model: a 24-layer MLP of width 256 (1.6 M
parameters, 49 gradient tensors, each its own name), batch 32, SGD with
momentum: a short step shows the fixed per-step cost.

    mpiexec -n 2 python benchmarks/keras_hyperparameter_check_cost.py --blocks 21

Prints, on rank 0, the median milliseconds per step of each mode and
`begin`'s microseconds; writes every block to
benchmarks/results/keras_hyperparameter_check_cost-<N>.json.
"""
from __future__ import annotations

import argparse
import os
import time
import timeit

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
import keras  # noqa: E402

import gradflow.keras as gk  # noqa: E402
from _benchutil import report_check_modes  # noqa: E402  (benchmarks/ is on sys.path)
from gradflow import hyperparameter_tag as tag  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--blocks", type=int, default=21, help="blocks per mode")
parser.add_argument("--steps", type=int, default=64, help="batches per block")
args = parser.parse_args()

gk.init()
R, N = gk.rank(), gk.size()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((256,))] +
                         [keras.layers.Dense(256, activation="relu") for _ in range(24)] +
                         [keras.layers.Dense(10)])
opt = gk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(R)
x = rng.standard_normal((32, 256)).astype(np.float32)
y = rng.integers(0, 10, 32)

MODES = {"check every 16": 16, "no tagged round": 1 << 40}
ORDER = [m for b in range(args.blocks) for m in (list(MODES) if b % 2 == 0 else
                                                   list(MODES)[::-1])]
times = {m: [] for m in MODES}


class Blocks(keras.callbacks.Callback):
    """Batch 0..steps-1: warm-up (tracing); then one block per mode in ORDER."""

    def __init__(self):
        super().__init__()
        self.t0 = None

    def on_train_batch_begin(self, batch, logs=None):
        block, at = divmod(batch, args.steps)
        if at:
            return
        now = time.perf_counter()
        if block >= 2:  # block 1 (the first timed one) just ended
            times[ORDER[block - 2]].append((now - self.t0) / args.steps * 1e3)
        if block >= 1 and block - 1 < len(ORDER):
            tag.CHECK_EVERY = MODES[ORDER[block - 1]]
        self.t0 = now


batches = (len(ORDER) + 2) * args.steps  # warm-up, the blocks, one batch that closes the last
data = tf.data.Dataset.from_tensors((x, y)).repeat(batches)
model.fit(data, epochs=1, verbose=0, shuffle=False, callbacks=[Blocks()])
tag.CHECK_EVERY = 16
check = opt._gradflow_hyper
lr = np.array([0.01])
begin_us = timeit.timeit(lambda: check.begin(lr), number=2000) / 2000 * 1e6
if R == 0:
    report_check_modes("keras_hyperparameter_check_cost", N, args.steps, times,
                       "check every 16", "no tagged round", {"begin_us": begin_us},
                       f"begin (fold + tag): {begin_us:.1f} us per round")
