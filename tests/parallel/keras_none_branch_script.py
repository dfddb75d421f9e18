# tests/parallel/keras_none_branch_script.py — SPMD script (test_tensorflow.py):
# two Keras situations where the ranks' models are not alike at a step.
# 1. Python control flow in call() uses a layer on some ranks only, run
#    eagerly (the torch backend; run_eagerly=True on TensorFlow): Note [None on
#    some ranks] in gradflow/missing_gradients.py. Before, the ranks without
#    that gradient skipped its name and the core paired it with another
#    step's gradient (max diff 0.17). Now the weights equal (1e-6) a
#    run where the other ranks add 0 * branch (a zero gradient, no None), with
#    and without accumulation, under a LossScaleOptimizer too; a layer no rank
#    uses keeps its weights.
# 2. A model without variables when training begins (Sequential without an
#    Input, a subclassed model; the TensorFlow backend builds it while tracing
#    the first step) and BroadcastGlobalVariablesCallback, each rank seeded
#    differently. Before, the callback built the optimizer over no variables
#    and the first step raised "Unknown variable". Now the broadcast happens
#    after the first batch (Horovod's timing): weights and optimizer slots
#    bitwise identical at the end. Exits non-zero on failure.
import sys

from _tf_common import keras, tf  # noqa: F401,E402  (before TensorFlow loads)
import numpy as np  # noqa: E402

import gradflow.keras as hvd  # noqa: E402
import gradflow.tensorflow as gtf  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
BACKEND = keras.backend.backend()


def uses_branch(rank: int, step: int) -> bool:
    return (rank + step) % 2 == 0  # some ranks, not all, at every step (N >= 2)


class Branchy(keras.Model):
    """`a` always; `b` on the ranks uses_branch picks (the others add
    0 * b(x) when `zero_branch`, which gives b a zero gradient instead of
    None); `never` on no rank."""

    def __init__(self, zero_branch: bool):
        super().__init__()
        self.a, self.b, self.never = (keras.layers.Dense(3) for _ in range(3))
        self.zero_branch = zero_branch
        self.steps = 0

    def build(self, input_shape):
        for layer in (self.a, self.b, self.never):
            layer.build(input_shape)

    def call(self, x, training=False):
        y = self.a(x)
        if training:
            self.steps += 1
            if uses_branch(R, self.steps):
                y = y + self.b(x)
            elif self.zero_branch:
                y = y + 0.0 * self.b(x)
        return y


def data():
    rng = np.random.default_rng(7 + R)
    return rng.normal(size=(32, 5)).astype(np.float32), rng.normal(size=(32, 3)).astype(np.float32)


def identical(arrays) -> bool:
    mine = b"".join(np.asarray(a).tobytes() for a in arrays)
    return all(other == mine for other in gtf.allgather_object(mine))


def fit_branchy(mode: str, zero_branch: bool):
    keras.utils.set_random_seed(0)
    model = Branchy(zero_branch)
    model.build((None, 5))
    bpps = 2 if mode == "bpps=2" else 1
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                   backward_passes_per_step=bpps)
    if mode == "LossScaleOptimizer around":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    never_before = [np.array(v) for v in model.never.get_weights()]
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model, never_before


for mode in ("bpps=1", "bpps=2", "LossScaleOptimizer around"):
    model, never_before = fit_branchy(mode, zero_branch=False)
    reference, _ = fit_branchy(mode, zero_branch=True)
    got, ref = model.get_weights(), reference.get_weights()
    assert identical(got), f"{mode}: weights differ between ranks"
    diff = max(float(np.max(np.abs(g - r))) for g, r in zip(got, ref))
    assert diff <= 1e-6, f"{mode}: max abs difference to the zero-branch run {diff}"
    assert not np.allclose(model.b.get_weights()[0], reference.b.get_weights()[0] * 0), mode
    for before, after in zip(never_before, model.never.get_weights()):
        assert np.array_equal(before, after), f"{mode}: a layer no rank uses moved"
    print(f"ok None on some ranks, {BACKEND}, {mode}, max diff {diff:.1e}", flush=True)


class Lazy(keras.Model):
    """Subclassed, no build(): its variables appear at the first call."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(6, activation="relu"), keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.hidden(x))


for kind in ("Sequential without Input", "subclassed"):
    keras.utils.set_random_seed(R)  # different on every rank: the callback aligns them
    model = (Lazy() if kind == "subclassed" else
             keras.Sequential([keras.layers.Dense(6, activation="relu"), keras.layers.Dense(3)]))
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse")
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert identical(model.get_weights()), f"{kind}: weights differ between ranks"
    slots = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    assert len(slots) > 2 and identical(slots), f"{kind}: optimizer state differs between ranks"
    print(f"ok unbuilt model broadcast after the first batch, {BACKEND}, {kind}", flush=True)

sys.exit(0)
