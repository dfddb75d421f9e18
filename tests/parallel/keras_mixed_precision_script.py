# tests/parallel/keras_mixed_precision_script.py — SPMD script
# (test_tensorflow.py): Keras 3 mixed precision (mixed_float16, whose
# LossScaleOptimizer model.compile adds by itself, or one the user puts
# around or inside gradflow's DistributedOptimizer) with an fp16 overflow in
# one batch on the last rank only. Note [LossScaleOptimizer]
# (gradflow/keras/loss_scale.py): before, that rank skipped the reduction
# the others waited in, and the job died at GRADFLOW_TIMEOUT. Now every rank
# skips exactly that batch: parameters bitwise identical, the loss scale
# halved once everywhere, and the weights equal (fp16 tolerance) a run
# whose data lacks that batch on every rank. Also float8 (model.quantize):
# its scales and amax histories Max-reduced across ranks (Note [Overwritten
# variables]). And CSC under a LossScaleOptimizer: residuals in unscaled units
# (Note [Residuals in unscaled units]). Exits non-zero on failure.
import sys

from _tf_common import keras, tf  # noqa: F401,E402  (before TensorFlow loads)
import numpy as np  # noqa: E402

import gradflow.keras as hvd  # noqa: E402
import gradflow.tensorflow as gtf  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
keras.mixed_precision.set_global_policy("mixed_float16")
BATCH, BAD = 8, 2  # the overflow is in batch BAD of the last rank


def data(skip_bad: bool):
    rng = np.random.default_rng(100 + R)
    x = rng.normal(size=(8 * BATCH, 10)).astype(np.float32)
    y = rng.integers(0, 3, 8 * BATCH)
    if R == N - 1:
        x[BAD * BATCH + 3] = 1e6  # inf in float16 activations, NaN gradients
    if skip_bad:  # every rank drops that batch
        keep = np.r_[0:BAD * BATCH, (BAD + 1) * BATCH:len(x)]
        x, y = x[keep], y[keep]
    return x, y


def fit(mode: str, bpps: int, skip_bad: bool):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    sgd = keras.optimizers.SGD(0.1)
    if mode == "compile adds it":
        opt = hvd.DistributedOptimizer(sgd, backward_passes_per_step=bpps)
    elif mode == "around gradflow's":
        opt = keras.optimizers.LossScaleOptimizer(
            hvd.DistributedOptimizer(sgd, backward_passes_per_step=bpps))
    else:  # "inside gradflow's" (Horovod's order)
        opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(skip_bad)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    w = np.concatenate([v.numpy().ravel().astype(np.float64) for v in model.trainable_variables])
    return w, float(model.optimizer.dynamic_scale.numpy())


CASES = [("compile adds it", 1), ("around gradflow's", 1), ("inside gradflow's", 1),
         ("compile adds it", 2), ("around gradflow's", 2)]
for mode, bpps in CASES:
    w, scale = fit(mode, bpps, skip_bad=False)
    every = gtf.allgather_object((w.tobytes(), scale))
    assert all(e == every[0] for e in every), f"{mode}, bpps={bpps}: ranks differ"
    assert np.isfinite(w).all(), f"{mode}, bpps={bpps}: non-finite weights"
    assert scale == 32768.0 / 2, f"{mode}, bpps={bpps}: loss scale {scale}, expected one halving"
    ref, ref_scale = fit(mode, bpps, skip_bad=True)
    assert ref_scale == 32768.0, ref_scale
    err = np.abs(w - ref).max()
    assert err < 2e-3, f"{mode}, bpps={bpps}: differs from the run without that batch by {err}"
    if R == 0:
        print(f"ok mixed_float16 overflow on one rank, {keras.backend.backend()}, {mode}, "
              f"bpps={bpps} (max diff {err:.1e})",
              flush=True)

# a 16-bit wire with accumulation under a loss scaler: refused, clearly, on every rank
try:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(3)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                     compression=hvd.Compression.fp16,
                                                     backward_passes_per_step=2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data(False)
    model.fit(x[:16] * 0, y[:16], batch_size=BATCH, epochs=1, verbose=0)
except ValueError as e:
    assert "16-bit wire" in str(e) and "LossScaleOptimizer" in str(e), str(e)
else:
    sys.exit("fp16 wire + bpps=2 + LossScaleOptimizer was not refused")
if R == 0:
    print("ok 16-bit wire + accumulation under a loss scaler refused", flush=True)


# float8 (model.quantize("float8")): each layer's scales and amax histories
# are overwritten with their "gradients" (Note [Overwritten variables],
# gradflow/keras/overwritten.py), which must be the Max over the ranks: the
# first layer's history then holds the global batch's max |x| of each update
# (of each k batches: Keras keeps the maximum). Before 2026-11-29 it held the
# ranks' mean (k = 1), or each rank its own (k = 2: 1.96 apart).
keras.mixed_precision.set_global_policy("float32")
rng = np.random.default_rng(7)
X8 = (rng.normal(size=(N, 4 * 16, 8)) * (1.0 + np.arange(N))[:, None, None]).astype(np.float32)
Y8 = rng.normal(size=(N, 4 * 16, 4)).astype(np.float32)
for bpps in (1, 2):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
    model.quantize("float8")
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                     backward_passes_per_step=bpps), loss="mse")
    model.fit(X8[R], Y8[R], batch_size=16, epochs=1, verbose=0, shuffle=False)
    state = [np.asarray(keras.ops.convert_to_numpy(v)).tobytes() for v in model.variables]
    every = gtf.allgather_object(state)
    assert all(e == every[0] for e in every), f"float8, bpps={bpps}: ranks differ"
    history = keras.ops.convert_to_numpy(model.layers[0].inputs_amax_history)
    batch_max = np.abs(X8).reshape(N, 4, -1).max(axis=(0, 2))  # global max |x| per batch
    want = batch_max.reshape(-1, bpps).max(axis=1)
    assert sorted(history[history > 0].tolist()) == sorted(want.tolist()), (bpps, history, want)
    if R == 0:
        print(f"ok float8 scales Max-reduced, {keras.backend.backend()}, bpps={bpps}", flush=True)

# A local layer (PartialDistributedOptimizer) keeps its own float8 state.
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
model.quantize("float8")
model.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.01),
                                                        local_layers=model.layers[0]), loss="mse")
model.fit(X8[R], Y8[R], batch_size=16, epochs=1, verbose=0, shuffle=False)
history = keras.ops.convert_to_numpy(model.layers[0].inputs_amax_history)
mine = np.abs(X8[R]).reshape(4, -1).max(axis=1)
assert sorted(history[history > 0].tolist()) == sorted(mine.tolist()), (history, mine)
shared = gtf.allgather_object(keras.ops.convert_to_numpy(model.layers[1].kernel_scale).tobytes())
assert all(e == shared[0] for e in shared), "float8: a shared layer's scale differs"
if R == 0:
    print(f"ok float8 state of a local layer stays local, {keras.backend.backend()}", flush=True)

# Note [Residuals in unscaled units] (gradflow/keras/loss_scale.py): with CSC
# the core keeps each gradient's unsent part; under a LossScaleOptimizer it
# used to be kept in scaled units, so a change of the scale re-weighted it
# (2 ranks: 0.0251 off). float32 with a scale that doubles every 2 steps
# (exact: powers of two) must now train bitwise as without a loss scaler,
# around gradflow's optimizer and inside it (Horovod's order).
rng = np.random.default_rng(100 + R)
XS, YS = rng.normal(size=(12 * 8, 10)).astype(np.float32), rng.integers(0, 3, 12 * 8)


def csc_fit(mode: str) -> np.ndarray:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(3)])
    sgd = keras.optimizers.SGD(0.1, momentum=0.5)

    def scaler(o):
        return keras.optimizers.LossScaleOptimizer(o, initial_scale=4.0, dynamic_growth_steps=2)

    if mode == "inside":
        opt = hvd.DistributedOptimizer(scaler(sgd), sparse_ratio=0.5, name=f"csc.{mode}")
    else:
        opt = hvd.DistributedOptimizer(sgd, sparse_ratio=0.5, name=f"csc.{mode}")
        opt = scaler(opt) if mode == "around" else opt
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(XS, YS, batch_size=8, epochs=1, verbose=0, shuffle=False)
    if mode != "plain":
        assert float(keras.ops.convert_to_numpy(opt.dynamic_scale)) == 4.0 * 2 ** 6, mode
    return np.concatenate([keras.ops.convert_to_numpy(v).ravel() for v in model.trainable_variables])


plain = csc_fit("plain")
for mode in ("around", "inside"):
    w = csc_fit(mode)
    every = gtf.allgather_object(w.tobytes())
    assert all(e == every[0] for e in every), f"CSC under a loss scaler, {mode}: ranks differ"
    assert np.array_equal(w, plain), \
        f"CSC under a loss scaler, {mode}: {np.abs(w - plain).max()} off the run without one"
    if R == 0:
        print(f"ok CSC residuals unscaled, {keras.backend.backend()}, {mode}", flush=True)
