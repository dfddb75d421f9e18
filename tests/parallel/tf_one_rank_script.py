# tests/parallel/tf_one_rank_script.py — one rank (gradflow/one_rank.py), run by
# test_tf_one_rank.py under `mpiexec -n 1`: the Keras DistributedOptimizer
# (model.fit compiled and eager, every mode) and DistributedGradientTape
# (tf.function and eager, every mode, IndexedSlices, local sources) train bit
# for bit like plain Keras / a plain tf.GradientTape and submit nothing to
# the core; argument errors still raise; a traced step in elastic mode still
# goes through the core; gradflowrun --monitor still counts steps.
# Prints "tf one rank OK: <stage>" per stage; exits non-zero on failure.
import numpy as np

from _tf_common import keras, small_classifier, tf  # first: sets TensorFlow up before it loads
import gradflow
import gradflow.keras as gk
import gradflow.tensorflow as gtf
from gradflow import monitor
from gradflow.elastic import worker as elastic_worker
from gradflow.tensorflow import overlap

gtf.init()
assert gtf.size() == 1, "run with one rank"
RNG = np.random.default_rng(0)
X = RNG.standard_normal((48, 10)).astype(np.float32)
Y = RNG.integers(0, 3, 48).astype(np.int32)
B = 8


def ok(stage):
    print(f"tf one rank OK: {stage}", flush=True)


def core_calls():
    """Collectives the core ran plus gradient submits made: both stay put
    when nothing crosses to the core."""
    return gradflow.stats().get("allreduce.count", 0.0), overlap.overlapped_submits()


def expect_error(fn, kind, *fragments):
    try:
        fn()
    except kind as e:
        for f in fragments:
            assert f in str(e), f"{f!r} not in {e}"
        return
    raise AssertionError(f"{kind.__name__} not raised")


def sgd(accumulate=None):
    return keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=accumulate)


class SummedAccumulation(keras.optimizers.SGD):
    """Plain Keras with Horovod's sum over accumulated passes (what the
    wrapper's backward_passes_per_step means without average_aggregated)."""

    def _clip_gradients(self, grads):
        k = float(self.gradient_accumulation_steps)
        return super()._clip_gradients([None if g is None else g * k for g in grads])


def fit(opt, run_eagerly, seed=3, local_first_layer=False):
    model = small_classifier(seed)
    if local_first_layer:
        opt = opt(model.layers[0])
    model.compile(optimizer=opt, run_eagerly=run_eagerly, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, Y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return [v.numpy() for v in model.weights]


def assert_bitwise(got, want, what):
    assert len(got) == len(want), what
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert a.tobytes() == b.tobytes(), f"{what}: differs from plain Keras by " \
                                           f"{np.abs(a.astype(np.float64) - b).max()}"


# 1. Keras DistributedOptimizer, model.fit compiled and eager: every mode is
#    plain Keras bit for bit and nothing crosses to the core.
FP16, BF16 = gk.Compression.fp16, gk.Compression.bf16
MODES = {
    "dense": ({}, sgd), "fp16 wire": (dict(compression=FP16), sgd),
    "bf16 wire": (dict(compression=BF16), sgd), "csc 0.01": (dict(sparse_ratio=0.01), sgd),
    "all (fp16 + csc 0.01)": (dict(compression=FP16, sparse_ratio=0.01), sgd),
    "predivide 3": (dict(gradient_predivide_factor=3.0), sgd), "op Sum": (dict(op=gk.Sum), sgd),
    "op Adasum": (dict(op=gtf.Adasum), sgd), "sparse_as_dense": (dict(sparse_as_dense=True), sgd),
    "2 passes, summed": (dict(backward_passes_per_step=2),
                         lambda: SummedAccumulation(0.1, momentum=0.9,
                                                    gradient_accumulation_steps=2)),
    "2 passes, averaged": (dict(backward_passes_per_step=2, average_aggregated_gradients=True),
                           lambda: sgd(2)),
}
for eager in (False, True):
    for what, (kw, plain) in MODES.items():
        want = fit(plain(), eager)
        before = core_calls()
        got = fit(gk.DistributedOptimizer(sgd(), name=f"m.{what}", **kw), eager)
        assert core_calls() == before, f"{what}: one rank crossed to the core"
        assert_bitwise(got, want, f"model.fit {'eager' if eager else 'compiled'} {what}")
    # PartialDistributedOptimizer: the local layer's gradient divided by 1 is itself.
    want = fit(sgd(), eager)
    before = core_calls()
    got = fit(lambda layer: gk.PartialDistributedOptimizer(sgd(), local_layers=[layer]), eager,
              local_first_layer=True)
    assert core_calls() == before, "partial: one rank crossed to the core"
    assert_bitwise(got, want, "PartialDistributedOptimizer")
ok("model.fit compiled and eager, every mode, plain Keras bit for bit")

# 2. DistributedGradientTape in a custom loop, tf.function and eager: the
#    gradients are the plain tape's, IndexedSlices included.
VOCAB = 6
emb0 = np.random.default_rng(1).standard_normal((VOCAB, 10)).astype(np.float32)
IDS = tf.constant(np.array([1, 4, 4, 0, 5], np.int32))
XB, YB = tf.constant(X[:B]), tf.constant(Y[:B])


def grads_fn(model, variables, kw, wrapped, local=None, traced=False):
    """The gradients of a small model with an embedding (its gradient is
    tf.IndexedSlices), through a plain or a Distributed tape."""
    def grads():
        with tf.GradientTape() as tape:
            h = tf.reduce_mean(tf.gather(variables[0], IDS)) + XB
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                YB, model(h), from_logits=True))
        if wrapped:
            tape = gtf.DistributedGradientTape(tape, name="tape", **kw)
            if local is not None:
                tape.register_local_source(local)
        return tape.gradient(loss, variables)
    return tf.function(grads) if traced else grads


def model_and_variables(seed=5):
    model = small_classifier(seed)
    return model, [tf.Variable(emb0)] + model.trainable_variables


TAPE_MODES = {"dense": {}, "fp16 wire": dict(compression=FP16),
              "all (fp16 + csc 0.01)": dict(compression=FP16, sparse_ratio=0.01),
              "predivide 3": dict(gradient_predivide_factor=3.0), "op Sum": dict(op=gtf.Sum),
              "op Adasum": dict(op=gtf.Adasum), "sparse_as_dense": dict(sparse_as_dense=True),
              "local source": {}}


def same_gradient(a, b, what):
    if isinstance(b, tf.IndexedSlices):
        assert isinstance(a, tf.IndexedSlices), f"{what}: IndexedSlices not kept"
        assert a.indices.numpy().tobytes() == b.indices.numpy().tobytes(), what
        a, b = a.values, b.values
    assert a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes(), what


for traced in (True, False):
    mode = "tf.function" if traced else "eager"
    for what, kw in TAPE_MODES.items():
        model, variables = model_and_variables()
        local = model.trainable_variables[0] if what == "local source" else None
        want = grads_fn(model, variables, {}, False, traced=traced)()
        wrapped = grads_fn(model, variables, kw, True, local, traced)
        before = core_calls()
        for _ in range(2):  # the traced function runs twice: still nothing sent
            got = wrapped()
        assert core_calls() == before, f"tape {mode} {what}: one rank crossed to the core"
        if kw.get("sparse_as_dense"):
            assert not isinstance(got[0], tf.IndexedSlices), "sparse_as_dense not honoured"
            want = [tf.convert_to_tensor(want[0])] + list(want[1:])
        for i, (a, b) in enumerate(zip(got, want)):
            same_gradient(a, b, f"tape {mode} {what} gradient {i}")
ok("DistributedGradientTape tf.function and eager, every mode, plain tape bit for bit")

# 3. Argument errors still raise on one rank.
w = tf.Variable(np.ones(3, np.float32))


def tape_gradient(**kw):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    return gtf.DistributedGradientTape(tape, **kw).gradient(loss, [w])


expect_error(lambda: tape_gradient(op=gtf.Min), ValueError, "Sum, Average or Adasum")
expect_error(lambda: tape_gradient(op=gtf.Sum, gradient_predivide_factor=2.0), ValueError,
             "gradient_predivide_factor needs op=Average")
expect_error(lambda: tape_gradient(sparse_ratio=1.5), ValueError, "sparse_ratio")
expect_error(lambda: tape_gradient(op=gtf.Adasum, compression=FP16), ValueError, "Adasum")
expect_error(lambda: gk.DistributedOptimizer(sgd(), sparse_ratio=0.0), ValueError, "sparse_ratio")
expect_error(lambda: gk.DistributedOptimizer(sgd(), backward_passes_per_step=0), ValueError,
             "backward_passes_per_step")
opt = gk.DistributedOptimizer(sgd(), sparse_ratio=0.5)
expect_error(lambda: setattr(opt, "sparse_ratio", 2.0), ValueError, "sparse_ratio")
opt.sparse_ratio = 0.25  # a valid change (SparseWarmupCallback) is taken
assert opt.sparse_ratio == 0.25
expect_error(lambda: fit(gk.DistributedOptimizer(sgd(), op=gtf.Min), False), ValueError,
             "Sum, Average or Adasum")
model = small_classifier(3)
model.compile(optimizer=gk.DistributedOptimizer(sgd()), jit_compile=True,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
expect_error(lambda: model.fit(X, Y, batch_size=B, epochs=1, verbose=0), Exception, "XLA")
ok("argument errors and the XLA refusal still raise")

# 4. A traced step in elastic mode goes through the core (the world may grow
#    under a compiled step); an eager one still decides per call.
elastic_worker._link = object()  # what init() sets in an elastic worker
try:
    model, variables = model_and_variables()
    before = core_calls()
    grads_fn(model, variables, {}, True)()
    assert core_calls() == before, "eager elastic step crossed to the core"
    got = grads_fn(model, variables, {}, True, traced=True)()
    assert core_calls()[1] > before[1], "traced elastic step took the one-rank path"
    want = grads_fn(model, variables, {}, False)()
    for i, (a, b) in enumerate(zip(got, want)):  # averaged over one rank: still the gradient
        a, b = (tf.convert_to_tensor(t).numpy() for t in (a, b))
        assert np.array_equal(a, b), f"elastic core path gradient {i}"
finally:
    elastic_worker._link = None
ok("a traced step in elastic mode reduces through the core")

# 5. gradflowrun --monitor still counts one step per reduction.
monitor._thread = object()  # what start_if_asked leaves when monitoring
try:
    model, variables = model_and_variables()
    for traced in (True, False):
        step = grads_fn(model, variables, {}, True, traced=traced)
        before = monitor.steps()
        for _ in range(3):
            step()
        assert monitor.steps() - before == 3, (traced, monitor.steps() - before)
finally:
    monitor._thread = None
ok("monitor step count")

gtf.shutdown()
w = tf.Variable(np.ones(3, np.float32))
expect_error(lambda: tape_gradient(), ValueError, "not been initialized")
# (the Keras wrapper is made without a collective; its first step raises)
expect_error(lambda: fit(gk.DistributedOptimizer(sgd()), False), ValueError, "not been initialized")
ok("use before init raises")
