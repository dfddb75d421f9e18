# tests/parallel/keras_torch_one_rank_script.py — Keras 3 on the torch backend
# over one rank (gradflow/one_rank.py), run by test_tf_one_rank.py: model.fit
# with DistributedOptimizer (fp16 wire + CSC, predivide, Sum) is plain Keras
# bit for bit and the core runs no allreduce. Prints "keras torch one rank OK".
import os

os.environ["KERAS_BACKEND"] = "torch"
import numpy as np  # noqa: E402
import keras  # noqa: E402
import torch  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402

torch.set_num_threads(1)
gk.init()
assert gk.size() == 1 and keras.backend.backend() == "torch"
rng = np.random.default_rng(0)
X = rng.standard_normal((48, 10)).astype(np.float32)
Y = rng.integers(0, 3, 48).astype(np.int32)


def fit(opt):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())


want = fit(keras.optimizers.SGD(0.1, momentum=0.9))
for kw in (dict(compression=gk.Compression.fp16, sparse_ratio=0.01),
           dict(gradient_predivide_factor=3.0), dict(op=gk.Sum)):
    before = gradflow.stats().get("allreduce.count", 0.0)
    got = fit(gk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **kw))
    assert gradflow.stats().get("allreduce.count", 0.0) == before, f"{kw}: crossed to the core"
    assert got == want, f"{kw}: differs from plain Keras"
print("keras torch one rank OK", flush=True)
gk.shutdown()
