# tests/parallel/keras_torch_backend_script.py — SPMD script (run by
# test_tensorflow.py): Keras 3 with KERAS_BACKEND=torch, DistributedOptimizer and
# callbacks in model.fit; weights identical on every rank, metrics averaged,
# and equal to single-process Keras training on the concatenated batches.
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
print(f"rank {R}: keras torch backend OK", flush=True)
