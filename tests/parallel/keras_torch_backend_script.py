# tests/parallel/keras_torch_backend_script.py — SPMD script (run by
# test_tensorflow.py): Keras 3 with KERAS_BACKEND=torch, DistributedOptimizer and
# callbacks in model.fit; weights identical on every rank, metrics averaged,
# and equal to single-process Keras training on the concatenated batches;
# fine-tuning with CSC (a layer frozen between fits) keeps each gradient's
# name (the test sets GRADFLOW_SPARSE_CHUNK=16, no CSC warm-up); a scalar
# (0-d) weight trains as in plain Keras.
import hashlib
import os

os.environ["KERAS_BACKEND"] = "torch"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import keras  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402

torch.set_num_threads(1)
gk.init()
R, N = gk.rank(), gk.size()
assert keras.backend.backend() == "torch"
X, Y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
keras.utils.set_random_seed(R)  # different: the broadcast callback aligns them
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(optimizer=gk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


class Raw(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.loss = []

    def on_epoch_end(self, epoch, logs=None):
        self.loss.append(logs["loss"])


raw = Raw()
hist = model.fit(X[R::N][:400], Y[R::N][:400], batch_size=32, epochs=2, verbose=0, shuffle=False,
                 callbacks=[gk.BroadcastGlobalVariablesCallback(0), raw, gk.MetricAverageCallback(),
                            gk.LearningRateWarmupCallback(0.05, warmup_epochs=1)])
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights()))
hashes = gradflow.allgather(np.frombuffer(digest.digest(), np.uint8)[None])
assert (hashes == hashes[0]).all(), "weights differ between ranks"
per_rank = gradflow.allgather(np.array(raw.loss, np.float64)[None])
assert np.allclose(hist.history["loss"], per_rank.mean(0)), (hist.history["loss"], per_rank)
assert abs(hist.history["lr"][-1] - 0.05) < 1e-7, hist.history["lr"]


# Against single-process Keras: every rank fits its shard (batch 32) with
# SGD + momentum over several steps; rank 0 fits a copy of the initial model
# on the global batches (each step's shards concatenated, batch 32 * N).
def make():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10)])


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dist = make()
dist.compile(optimizer=gk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=loss)
shards = [(X[r::N][:200], Y[r::N][:200]) for r in range(N)]
dist.fit(*shards[R], batch_size=32, epochs=2, verbose=0, shuffle=False,
         callbacks=[gk.BroadcastGlobalVariablesCallback(0)])
if R == 0:
    ref = make()
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    steps = range(0, 200, 32)
    xg = np.concatenate([xs[s:s + 32] for s in steps for xs, _ in shards])
    yg = np.concatenate([ys[s:s + 32] for s in steps for _, ys in shards])
    ref.fit(xg, yg, batch_size=32 * N, epochs=2, verbose=0, shuffle=False)
    a = np.concatenate([w.ravel() for w in dist.get_weights()])
    b = np.concatenate([w.ravel() for w in ref.get_weights()])
    err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
    assert err < 1e-5, f"keras torch backend differs from single-process training by {err}"


# Fine-tuning with CSC: layer 0 frozen for the second fit (compile again,
# same optimizer), unfrozen for the third. Each gradient is named by its
# variable's index in the optimizer, so its CSC residual stays its own
# (before 2026-11-29: by its position among the trainable variables, and
# layer 0's unsent gradient went into layer 1's). Reference: one allreduce
# per variable under its index, the same CSC, SGD by hand.
def finetune_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(16),
                             keras.layers.Dense(16), keras.layers.Dense(16)])


rng = np.random.default_rng(5)
XK = rng.standard_normal((3, 2, N, 8, 16)).astype(np.float32)  # phase, step, rank
YK = rng.standard_normal((3, 2, N, 8, 16)).astype(np.float32)
mse = keras.losses.MeanSquaredError()
ft, ref = finetune_model(), finetune_model()
opt = gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="finetune", sparse_ratio=0.25)
every = list(ref.trainable_variables)
for p, frozen in enumerate((False, True, False)):
    for m in (ft, ref):
        m.layers[0].trainable = not frozen
    ft.compile(optimizer=opt, loss=mse)
    ft.fit(XK[p, :, R].reshape(-1, 16), YK[p, :, R].reshape(-1, 16), batch_size=8,
           shuffle=False, verbose=0)
    for s in range(2):
        variables = ref.trainable_variables
        grads = torch.autograd.grad(mse(torch.tensor(YK[p, s, R]), ref(torch.tensor(XK[p, s, R]))),
                                    [v.value for v in variables])
        for v, g in zip(variables, grads):
            i = next(k for k, e in enumerate(every) if e is v)
            r = gradflow.allreduce(g.detach().numpy(), name=f"finetune.ref.{i}", sparse_ratio=0.25)
            v.assign(keras.ops.convert_to_numpy(v) - 0.1 * r)
for i, (w, r) in enumerate(zip(ft.get_weights(), ref.get_weights())):
    assert np.allclose(w, r, atol=1e-6), ("fine-tuning", i, np.abs(w - r).max())
    rows = gradflow.allgather(np.ascontiguousarray(w.reshape(1, -1)), name=f"finetune.w{i}")
    assert (rows == rows[0]).all(), "fine-tuning: ranks differ"


# A scalar (0-d) weight: its reduced gradient came back from the numpy core
# as shape [1] and the update raised "output with shape [] doesn't match the
# broadcast shape [1]" (before 2026-11-29). Against plain Keras on the
# combined batches, with and without accumulation.
class Scale(keras.layers.Layer):
    def build(self, shape):
        self.s = self.add_weight(shape=(), initializer="ones")

    def call(self, x):
        return x * self.s


XS = rng.standard_normal((4, N, 4, 4)).astype(np.float32)  # step, rank
YS = rng.standard_normal((4, N, 4, 2)).astype(np.float32)
for k in (1, 2):
    got = []
    for dist in (True, False):
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((4,)), Scale(), keras.layers.Dense(2)])
        base = keras.optimizers.SGD(0.1, gradient_accumulation_steps=None if dist or k == 1 else k)
        m.compile(optimizer=gk.DistributedOptimizer(base, backward_passes_per_step=k,
                                                    average_aggregated_gradients=True)
                  if dist else base, loss=mse)
        x, y = (XS[:, R], YS[:, R]) if dist else (XS, YS)
        m.fit(x.reshape(-1, 4), y.reshape(-1, 2), batch_size=4 if dist else 4 * N, shuffle=False,
              verbose=0)
        got.append(m.get_weights())
    assert got[0][0].shape == (), got[0][0].shape
    for w, r in zip(*got):
        assert np.allclose(w, r, atol=1e-6), ("scalar weight", k, np.abs(w - r).max())
print(f"rank {R}: keras torch backend OK", flush=True)
