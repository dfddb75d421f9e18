# tests/parallel/tf_one_rank_sets_script.py — a one-member process set inside a
# 2-4 rank job (gradflow/one_rank.py), run by test_tf_one_rank.py: the last
# rank alone in `alone`, the others in `rest`. A one-member set's
# DistributedGradientTape (tf.function and eager) and Keras model.fit
# (fp16 wire + CSC) are plain TF / Keras bit for bit and its engine runs no
# allreduce; a set of 2-3 members still reduces: tape gradients against the
# numpy mean of the members' own gradients, model.fit against one process
# training on the members' combined batches, bitwise identical on every
# member. Prints "tf one rank sets OK on N ranks" from rank 0.
import hashlib

import numpy as np

from _tf_common import keras, small_classifier, tf  # first: sets TensorFlow up before it loads
import gradflow
import gradflow.keras as gk
import gradflow.tensorflow as gtf

gtf.init()
R, N = gtf.rank(), gtf.size()
assert N >= 2, "run with 2 or more ranks"
alone = gtf.add_process_set([N - 1])
rest = gtf.add_process_set(list(range(N - 1)))
ps = alone if R == N - 1 else rest
m = ps.size()
ALL = dict(compression=gk.Compression.fp16, sparse_ratio=0.01)  # what one member must not apply


def allreduces():
    return gradflow.stats(process_set=ps).get("allreduce.count", 0.0)


def identical(a, what):
    """Every member of this rank's set holds the same bytes."""
    d = np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest(), np.uint8)
    every = gtf.allgather(tf.constant(d.reshape(1, -1)), process_set=ps).numpy()
    assert (every == every[0]).all(), f"rank {R}: {what} differs within the set"


def batch(r, rows=8):
    rng = np.random.default_rng(200 + r)
    return (rng.standard_normal((rows, 10)).astype(np.float32),
            rng.integers(0, 3, rows).astype(np.int32))


def grads_fn(model, x, y, kw=None, traced=False):
    """Gradients of model's loss on (x, y): a plain tape, or a Distributed
    one over `ps` with keywords `kw`."""
    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True))
        if kw is not None:
            tape = gtf.DistributedGradientTape(tape, process_set=ps, name="sets.tape", **kw)
        return tape.gradient(loss, model.trainable_variables)
    return tf.function(grads) if traced else grads


# 1. DistributedGradientTape over this rank's set, tf.function and eager.
model = small_classifier(11)
for traced in (True, False):
    what = "tf.function" if traced else "eager"
    x, y = batch(R)
    before = allreduces()
    got = [g.numpy() for g in grads_fn(model, x, y, dict(ALL) if m == 1 else {}, traced)()]
    if m == 1:
        want = [g.numpy() for g in grads_fn(model, x, y, traced=traced)()]
        assert allreduces() == before, f"rank {R}: one-member set ran an allreduce ({what})"
        for a, b in zip(got, want):
            assert a.tobytes() == b.tobytes(), f"rank {R}: one-member tape ({what}) differs"
    else:
        assert allreduces() > before, f"rank {R}: {m}-member set did not reduce ({what})"
        members = [[g.numpy() for g in grads_fn(model, *batch(q))()] for q in ps.ranks]
        for i, a in enumerate(got):
            want = np.mean(np.stack([mg[i] for mg in members]).astype(np.float64), axis=0)
            assert np.allclose(a, want, rtol=1e-5, atol=1e-6), \
                f"rank {R}: tape ({what}) gradient {i} off by {np.abs(a - want).max()}"
            identical(a, f"tape ({what}) gradient {i}")

# 2. Keras model.fit over this rank's set: one member is plain Keras bit for
#    bit; several members match one process on their combined batches.
B, S = 8, 5
rng = np.random.default_rng(300 + ps.process_set_id)
X = rng.standard_normal((S * B * m, 10)).astype(np.float32)
Y = rng.integers(0, 3, S * B * m).astype(np.int32)
k = ps.rank()
mine = np.concatenate([np.arange(s * B * m + k * B, s * B * m + (k + 1) * B) for s in range(S)])


def fit(x, y, batch_size, opt):
    net = small_classifier(11)
    net.compile(optimizer=opt, jit_compile=False,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    net.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return np.concatenate([v.numpy().reshape(-1) for v in net.weights])


before = allreduces()
dist = fit(X[mine], Y[mine], B, gk.DistributedOptimizer(
    keras.optimizers.SGD(0.1, momentum=0.9), process_set=ps, **(ALL if m == 1 else {})))
ref = fit(X, Y, B * m, keras.optimizers.SGD(0.1, momentum=0.9))
if m == 1:
    assert allreduces() == before, f"rank {R}: one-member set's model.fit ran an allreduce"
    assert dist.tobytes() == ref.tobytes(), f"rank {R}: one-member model.fit differs from Keras"
else:
    assert allreduces() > before, f"rank {R}: {m}-member set's model.fit did not reduce"
    assert np.allclose(dist, ref, atol=1e-5), (R, np.abs(dist - ref).max())
    identical(dist, "keras weights")

# Every rank is still in step with every other one.
assert int(gtf.allreduce(tf.constant([1]), op=gtf.Sum).numpy()[0]) == N
if R == 0:
    print(f"tf one rank sets OK on {N} ranks", flush=True)
gtf.shutdown()
