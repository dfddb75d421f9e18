# tests/parallel/keras_torch_backend_script.py — SPMD script (run by
# test_tensorflow.py): Keras 3 with KERAS_BACKEND=torch, DistributedOptimizer and
# callbacks in model.fit; weights identical on every rank, metrics averaged.
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
print(f"rank {R}: keras torch backend OK", flush=True)
