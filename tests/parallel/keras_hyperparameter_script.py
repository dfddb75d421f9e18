# keras_hyperparameter_script.py — SPMD (test_tensorflow.py, 2 and 3 ranks): the Keras
# DistributedOptimizer's hyperparameter check (gradflow/keras/hyperparameter_check.py,
# native Note [Step tags]). Arguments: the case and the path.
#   path: traced (model.fit's tf.function, gradients submitted during backward),
#     nooverlap (GRADFLOW_TF_OVERLAP=0: one crossing after backward), eager
#     (run_eagerly=True), lso (a LossScaleOptimizer around the wrapper), bpps2
#     (backward_passes_per_step=2), spe4 (steps_per_execution=4: four steps
#     per traced call), torch (KERAS_BACKEND=torch).
#   equal: a learning-rate schedule moving the rate alike, ReduceLROnPlateau
#     on a metric MetricAverageCallback averaged first, rates that differed
#     until BroadcastGlobalVariablesCallback, and (traced) join() after an
#     epoch with uneven batch counts: nothing raises, and the weights end
#     bitwise identical on every rank.
#   plateau: ReduceLROnPlateau on a rank-local metric lowers the rate on
#     rank 0 only after epoch 1: with default timeouts every rank's fit raises
#     within CHECK_EVERY rounds of the difference, naming both ranks' rates.
#   transient: one batch with another rate on the last rank only: the
#     16th round raises (the running CRC remembers it).
import os
import sys
import time

CASE, PATH = sys.argv[1], sys.argv[2]
if PATH == "torch":
    os.environ["KERAS_BACKEND"] = "torch"
if PATH == "nooverlap":
    os.environ["GRADFLOW_TF_OVERLAP"] = "0"
from _tf_common import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402
from gradflow.hyperparameter_tag import CHECK_EVERY  # noqa: E402

gk.init()
R, N = gk.rank(), gk.size()
assert keras.backend.backend() == ("torch" if PATH == "torch" else "tensorflow")
X, Y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
BATCH = 8
BPPS = 2 if PATH == "bpps2" else 1
SPE = 4 if PATH == "spe4" else 1  # steps_per_execution
STEPS_PER_EPOCH = 8 * BPPS  # batches; rounds per epoch: 8


def build(seed: int, lr: float = 0.05) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)])
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9),
                                  backward_passes_per_step=BPPS)
    if PATH == "lso":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    model.compile(optimizer=opt, run_eagerly=PATH in ("eager", "torch"),
                  steps_per_execution=SPE,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(epochs: int, short: int = 0):
    n = (epochs * STEPS_PER_EPOCH - short) * BATCH
    idx = np.arange(R, R + N * n, N) % len(X)
    return X[idx], Y[idx]


def fit(model, epochs, callbacks=()):
    x, y = data(1)
    return model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False,
                     callbacks=list(callbacks))


def assert_identical(model, what):
    flat = np.concatenate([np.ravel(keras.ops.convert_to_numpy(w)) for w in model.weights])
    every = gradflow.allgather(flat[None])
    assert all(np.array_equal(e.view(np.uint32), every[0].view(np.uint32)) for e in every), what


def ok(what):
    sys.stdout.write(f"ok {what}, {PATH}, rank {R}\n")
    sys.stdout.flush()


class RankMetric(keras.callbacks.Callback):
    """logs['rank_metric']: flat on rank 0 (a plateau there), falling
    elsewhere until epoch 2; so its average falls, then is flat from epoch 3."""

    def on_epoch_end(self, epoch, logs=None):
        logs["rank_metric"] = 1.0 if R == 0 else 1.0 / (min(epoch, 2) + 1)


class LastRankRateOnce(keras.callbacks.Callback):
    """Batches 4 and 5 (one update, also with backward_passes_per_step=2)
    run with rate 0.1 on the last rank only. With steps_per_execution=4 the
    callbacks see batches 0, 4, 8, ... only, so the rate stays 0.1 there
    from batch 4 on: still first caught by the 16th round."""

    def on_train_batch_begin(self, batch, logs=None):
        if R == N - 1 and batch in (4, 6):
            self.model.optimizer.learning_rate = 0.1 if batch == 4 else 0.05


if CASE == "equal":
    # A schedule moving the rate alike on every rank; a plateau on an
    # averaged metric; rates unequal until the broadcast (rank-dependent lr).
    model = build(1, lr=0.05 * (R + 1))
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="rank_metric", mode="min", patience=0,
                                                factor=0.5)
    epochs = 2 * CHECK_EVERY // 8 + 2
    fit(model, epochs, [gk.BroadcastGlobalVariablesCallback(0), schedule, RankMetric(),
                        gk.MetricAverageCallback(), plateau])
    lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    assert lr < 0.05 * 0.9 ** epochs * 0.5 * 1.001, f"the plateau did not lower the rate: {lr}"
    assert_identical(model, "schedule + averaged plateau")
    ok("rates moved alike raise nothing")
    if PATH == "traced":
        # join(): the last rank has CHECK_EVERY + 3 batches fewer; the others
        # go on through tagged rounds; the next fit's checks still line up.
        model = build(2)
        for short in (CHECK_EVERY + 3, 0):
            x, y = data(5, short if R == N - 1 else 0)
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
                      callbacks=[gk.BroadcastGlobalVariablesCallback(0)])
            assert gradflow.join() in range(N)
        assert_identical(model, "join")
        ok("join() with uneven batch counts raises nothing")
    sys.exit(0)


class BatchesDone(keras.callbacks.Callback):
    count = 0

    def on_train_batch_end(self, batch, logs=None):
        BatchesDone.count += 1


model = build(3)
t0 = time.monotonic()
error = ""
try:
    if CASE == "plateau":
        plateau = keras.callbacks.ReduceLROnPlateau(monitor="rank_metric", mode="min",
                                                    patience=0, factor=0.5)
        fit(model, 8, [gk.BroadcastGlobalVariablesCallback(0), BatchesDone(), RankMetric(),
                       plateau])
    else:
        fit(model, 4, [gk.BroadcastGlobalVariablesCallback(0), BatchesDone(), LastRankRateOnce()])
except Exception as e:  # noqa: BLE001 - GradflowError, or TF's OpError around it
    error = str(e)
took = time.monotonic() - t0
if R == 0:
    sys.stderr.write(f"rank 0's error: {error[-1200:]}\n")
assert error, "no error: the ranks trained with different learning rates"
assert "the ranks' optimizer hyperparameters differ: rank 0 submitted allreduce" in error, \
    error[-1500:]
assert error.count("now group 0: learning_rate=") >= 1, error[-1500:]
if CASE == "transient":
    assert f"but rank {N - 1} as part of" in error, error[-1500:]
# The round that raised: the first check round after the difference (the
# 16th; the plateau lowers rank 0's rate after epoch 1, i.e. from round 17,
# so the 32nd), counted in batches done before it.
# With steps_per_execution=4 the callbacks see one call per 4 batches.
check_round = CHECK_EVERY * (2 if CASE == "plateau" else 1)
assert BatchesDone.count == check_round * BPPS // SPE - 1, (BatchesDone.count, check_round)
assert took < 120, f"the error came after {took:.1f} s"
sys.stdout.write(f"{CASE} on the {PATH} path raised on rank {R} of {N}\n")
sys.stdout.flush()
