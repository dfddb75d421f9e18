"""TensorFlow ops and the Keras DistributedOptimizer with process_set=, on
2-4 ranks, run by test_process_sets.py (even and odd sets at once).
Checks, per set and against numpy: allreduce / allgather / broadcast /
alltoall / reducescatter eagerly and inside tf.function (names counted per
set), DistributedGradientTape(process_set=) against the mean of the
members' own gradients, and Keras model.fit with
DistributedOptimizer(process_set=) against single-process training on the
set's combined batches (members bitwise identical).
Prints "tf OK on N ranks" from rank 0."""
import hashlib

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.keras as gk  # noqa: E402
import gradflow.tensorflow as gtf  # noqa: E402

gtf.init()
R, N = gtf.rank(), gtf.size()
even = gtf.add_process_set([r for r in range(N) if r % 2 == 0])
odd = gtf.add_process_set([r for r in range(N) if r % 2 == 1])
ps = even if R % 2 == 0 else odd
m, k = ps.size(), ps.rank()


def x_of(r, shape=(4, 3)):
    return np.random.default_rng(r).standard_normal(shape).astype(np.float32)


def identical(a, what):
    d = np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest(), np.uint8)
    every = gtf.allgather(tf.constant(d.reshape(1, -1)), process_set=ps).numpy()
    assert (every == every[0]).all(), f"rank {R}: {what} differs within the set"


def ops(mode):
    run = (lambda f, *a: f(*a)) if mode == "eager" else (lambda f, *a: tf.function(f)(*a))
    want = sum(x_of(q) for q in ps.ranks)
    s = run(lambda x: gtf.allreduce(x, op=gtf.Sum, process_set=ps), x_of(R)).numpy()
    assert np.allclose(s, want, atol=1e-5), (R, mode)
    identical(s, f"{mode} allreduce")
    a = run(lambda x: gtf.allreduce(x, process_set=ps), x_of(R)).numpy()
    assert np.allclose(a, want / m, atol=1e-5), (R, mode)
    g = run(lambda x: gtf.allgather(x, process_set=ps), x_of(R, (R + 1, 2))).numpy()
    assert np.array_equal(g, np.concatenate([x_of(q, (q + 1, 2)) for q in ps.ranks])), (R, mode)
    b = run(lambda x: gtf.broadcast(x, ps.ranks[-1], process_set=ps), x_of(R)).numpy()
    assert np.array_equal(b, x_of(ps.ranks[-1])), (R, mode)
    # As Horovod: received splits come back only when splits are given.
    send = np.full((m, 2), R, np.float32)
    out = run(lambda x: gtf.alltoall(x, process_set=ps), send)
    want = np.repeat(np.array(ps.ranks, np.float32), 2).reshape(m, 2)
    assert np.array_equal(out.numpy(), want), (R, mode)
    out, got = run(lambda x: gtf.alltoall(x, [1] * m, process_set=ps), send)
    assert np.array_equal(out.numpy(), want), (R, mode)
    assert got.dtype == tf.int32 and list(got.numpy()) == [1] * m, (R, mode)
    rs = run(lambda x: gtf.reducescatter(x, op=gtf.Sum, process_set=ps), x_of(R, (m + 1, 2)))
    total = sum(x_of(q, (m + 1, 2)) for q in ps.ranks)
    assert np.allclose(rs.numpy(), np.array_split(total, m)[k], atol=1e-5), (R, mode)


for mode in ("eager", "function", "function"):  # twice traced: names must still agree
    ops(mode)

# DistributedGradientTape over the set: the mean of the members' own gradients.
w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * x_of(R, (2, 3)))
grad = gtf.DistributedGradientTape(tape, process_set=ps).gradient(loss, [w])[0].numpy()
assert np.allclose(grad, sum(x_of(q, (2, 3)) for q in ps.ranks) / m, atol=1e-6), R

# Keras fit per set against single-process training on the set's combined batches.
B, S = 8, 6
rng = np.random.default_rng(100 + ps.process_set_id)
X = rng.standard_normal((S * B * m, 10)).astype(np.float32)
Y = rng.integers(0, 3, S * B * m).astype(np.int32)
mine_rows = np.concatenate([np.arange(s * B * m + k * B, s * B * m + (k + 1) * B)
                            for s in range(S)])


def model_and_fit(x, y, batch, opt):
    keras.utils.set_random_seed(7 + ps.process_set_id)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return np.concatenate([v.numpy().reshape(-1) for v in model.weights])


dist = model_and_fit(X[mine_rows], Y[mine_rows], B,
                     gk.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=ps))
ref = model_and_fit(X, Y, B * m, keras.optimizers.SGD(0.1))
identical(dist, "keras weights")
assert np.allclose(dist, ref, atol=1e-5), (R, np.abs(dist - ref).max())
assert int(gtf.allreduce(tf.constant([1]), op=gtf.Sum).numpy()[0]) == N
if R == 0:
    print(f"tf OK on {N} ranks", flush=True)
gtf.shutdown()
