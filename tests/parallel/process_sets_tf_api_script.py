"""gradflow.tensorflow's Horovod 0.28 API functions with process_set=, on
3-4 ranks, run by test_process_sets.py (even and odd sets at once).
Checks, per set and against numpy (eagerly and inside tf.function where the
op is graph-capable): grouped_allgather and its gradient, reducescatter /
grouped_reducescatter with pre/postscale (Horovod's positional order),
broadcast_ / broadcast_variables, broadcast_object(_fn) / allgather_object
(one member's object unpicklable: every member raises),
size_op / process_set_included_op for registered ids,
PartialDistributedGradientTape and gradflow.tensorflow.DistributedOptimizer
over the set; unregistered sets raise ValueError even for empty lists.
Members end bitwise identical. Prints "tf api OK on N ranks" from rank 0."""
import hashlib
import threading

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow  # noqa: E402
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


def raises(fn, exc, text):
    try:
        fn()
    except exc as e:
        assert text in str(e), (R, str(e))
        return
    raise AssertionError(f"rank {R}: expected {exc.__name__} containing {text!r}")


def ops(mode):
    run = (lambda f, *a: f(*a)) if mode == "eager" else (lambda f, *a: tf.function(f)(*a))
    a, b = x_of(R, (R + 1, 2)), x_of(10 + R, (1, 3))
    ga, gb = run(lambda u, v: gtf.grouped_allgather([u, v], process_set=ps), a, b)
    assert np.array_equal(ga.numpy(), np.concatenate([x_of(q, (q + 1, 2)) for q in ps.ranks]))
    assert np.array_equal(gb.numpy(), np.concatenate([x_of(10 + q, (1, 3)) for q in ps.ranks]))
    x = x_of(R, (m + 1, 2))
    total = sum(x_of(q, (m + 1, 2)) for q in ps.ranks)
    # Horovod's positional order: (tensor, device_dense, compression, op, name, process_set).
    rs = run(lambda t: gtf.reducescatter(t, "", gtf.Compression.none, gtf.Sum, None, ps,
                                         prescale_factor=2.0, postscale_factor=0.25), x)
    assert np.allclose(rs.numpy(), np.array_split(total * 0.5, m)[k], atol=1e-5), (R, mode)
    grs = run(lambda t: gtf.grouped_reducescatter([t, t], op=gtf.Average, process_set=ps,
                                                  prescale_factor=3.0), x)
    for g in grs:
        assert np.allclose(g.numpy(), np.array_split(total * 3.0 / m, m)[k], atol=1e-5), R
    v = tf.Variable(x_of(R))
    run(lambda: gtf.broadcast_([v], ps.ranks[-1], process_set=ps))
    assert np.array_equal(v.numpy(), x_of(ps.ranks[-1])), (R, mode)
    w = tf.Variable(x_of(20 + R))

    def bcast_w():  # returns None: inside tf.function the group op is not returned
        gtf.broadcast_variables([w], ps.ranks[0], process_set=ps)

    run(bcast_w)
    assert np.array_equal(w.numpy(), x_of(20 + ps.ranks[0])), (R, mode)
    assert int(run(lambda: gtf.size_op(ps.process_set_id))) == m, (R, mode)
    inc = [int(run(lambda: gtf.process_set_included_op(s.process_set_id))) for s in (even, odd)]
    assert inc == [int(R % 2 == 0), int(R % 2 == 1)], (R, mode, inc)
    assert int(run(lambda: gtf.process_set_included_op())) == 1


for mode in ("eager", "function"):
    ops(mode)

# Gradient of grouped_allgather over the set (as Horovod: this rank's rows
# of the upstream gradient averaged over the members).
a = tf.Variable(x_of(R, (R + 1, 2)))
with tf.GradientTape() as tape:
    g, = gtf.grouped_allgather([a], process_set=ps)
    loss = tf.reduce_sum(g * float(R + 1))
got = tape.gradient(loss, a).numpy()
assert np.allclose(got, np.full((R + 1, 2), np.mean([q + 1 for q in ps.ranks])), atol=1e-6), R

# Python objects.
assert gtf.broadcast_object({"r": R}, root_rank=ps.ranks[-1], process_set=ps) == {
    "r": ps.ranks[-1]}
assert gtf.allgather_object((R, "x" * R), process_set=ps) == [(q, "x" * q) for q in ps.ranks]
fn = gtf.broadcast_object_fn(root_rank=ps.ranks[0], process_set=ps)
assert fn([R] * (R + 1)) == [ps.ranks[0]] * (ps.ranks[0] + 1)
# One member's object cannot be pickled: every member raises at once, the
# others naming that member by its global rank.
try:
    gtf.allgather_object(threading.Lock() if R == ps.ranks[-1] else R, process_set=ps)
except (TypeError, gradflow.GradflowError) as e:
    assert isinstance(e, TypeError if R == ps.ranks[-1] else gradflow.GradflowError), repr(e)
    assert "cannot pickle" in str(e), e
    assert R == ps.ranks[-1] or f"rank(s) {ps.ranks[-1]} could not" in str(e), e
else:
    raise AssertionError("allgather_object of a lock did not raise")
assert gtf.allgather_object(R, process_set=ps) == ps.ranks

# PartialDistributedGradientTape: shared weights averaged over the members,
# local weights this rank's own gradient divided by the set's size.
keras.utils.set_random_seed(3)
shared, local = keras.layers.Dense(3), keras.layers.Dense(2)
model = keras.Sequential([keras.Input((4,)), shared, local])
xb = x_of(R, (5, 4))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(xb) ** 2)
own = tape.gradient(loss, model.trainable_variables)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(xb) ** 2)
grads = gtf.PartialDistributedGradientTape(tape, local_layers=[local], process_set=ps).gradient(
    loss, model.trainable_variables)
every = gtf.allgather(tf.constant(np.concatenate([g.numpy().ravel() for g in own[:2]])[None]),
                      process_set=ps).numpy()
mean_shared = every.mean(0)
got_shared = np.concatenate([g.numpy().ravel() for g in grads[:2]])
assert np.allclose(got_shared, mean_shared, atol=1e-5), R
identical(got_shared, "partial tape shared grads")
for g, o in zip(grads[2:], own[2:]):
    assert np.allclose(g.numpy(), o.numpy() / m, atol=1e-6), R

# horovod.tensorflow.DistributedOptimizer over the set: SGD(1) moves by the mean gradient.
wv = keras.Variable(np.zeros(3, np.float32))
opt = gtf.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps)
opt.apply([tf.constant(np.full(3, R + 1.0, np.float32))], [wv])
assert np.allclose(wv.numpy(), -np.mean([q + 1.0 for q in ps.ranks])), (R, wv.numpy())

# Unregistered sets: ValueError on every rank, even for empty lists.
loose = gtf.ProcessSet([0])
for fn_, what in ((lambda: gtf.grouped_allgather([], process_set=loose), "grouped_allgather"),
                  (lambda: gtf.grouped_reducescatter([], process_set=loose), "not registered"),
                  (lambda: gtf.broadcast_([], 0, process_set=loose), "broadcast_"),
                  (lambda: gtf.broadcast_variables([], 0, process_set=loose), "not registered"),
                  (lambda: gtf.broadcast_object_fn(0, process_set=loose), "not registered"),
                  (lambda: gtf.size_op(99), "not registered"),
                  (lambda: gtf.process_set_included_op(99), "not registered")):
    raises(fn_, ValueError, what)
assert int(gtf.allreduce(tf.constant([1]), op=gtf.Sum).numpy()[0]) == N
if R == 0:
    print(f"tf api OK on {N} ranks", flush=True)
gtf.shutdown()
