# tests/parallel/tf_hvd_api_script.py — SPMD script (run by test_tensorflow.py
# under mpiexec, 2 and 3 ranks): Horovod 0.28's horovod.tensorflow API in
# gradflow.tensorflow — reducescatter with pre/postscale, grouped
# allgather/reducescatter, alltoall without splits, broadcast_, join, object
# broadcast/allgather, broadcast_global_variables, (Partial)DistributedGradientTape,
# rank_op/size_op, DistributedOptimizer, Keras float8 through the tape (amax Max-reduced)
# — eager and in tf.function, against numpy closed forms, gradients against
# analytic values, and results compared bitwise across ranks. Exits non-zero on failure.
import pickle
import threading

import numpy as np

from _tf_common import keras, tf  # first: sets TensorFlow up before it loads
import gradflow as gflow
import gradflow.tensorflow as gtf

gtf.init()
R, N = gtf.rank(), gtf.size()
SAME = []  # (what, bytes) that must be bitwise identical on every rank


def close(a, b, what, tol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert a.dtype == b.dtype or np.issubdtype(b.dtype, np.floating), f"{what}: dtype {a.dtype}"
    assert np.allclose(a, b, atol=tol, rtol=tol), f"{what}: {a} != {b}"


def same(what, a):
    SAME.append((what, np.asarray(a).tobytes()))


def x_of(r, shape, dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * r).astype(dtype)


def block(rows, r):  # the core's split: earlier ranks get the remainder
    counts = [rows // N + (1 if p < rows % N else 0) for p in range(N)]
    lo = sum(counts[:r])
    return slice(lo, lo + counts[r])


def eager(fn, *args):
    out = fn(*[tf.constant(a) for a in args])
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def graph(fn, *args):
    out = tf.function(fn)(*[tf.constant(a) for a in args])
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def check_scatter_gather(mode, run):
    rows = 2 * N + 1
    xs = [x_of(r, (rows, 2)) for r in range(N)]
    # Horovod's positional order: (tensor, device_dense, compression, op, name, process_set,
    # ignore_name_scope, prescale_factor, postscale_factor)
    got = run(lambda x: gtf.reducescatter(x, "", gtf.Compression.none, gtf.Sum, None, None, False,
                                          2.0, 0.25), xs[R])
    close(got, (np.sum(xs, 0) * 0.5)[block(rows, R)], f"{mode} reducescatter sum scaled")
    got = run(lambda x: gtf.reducescatter(x, prescale_factor=3.0), xs[R])
    close(got, (np.mean(xs, 0) * 3.0)[block(rows, R)], f"{mode} reducescatter avg prescaled", 1e-5)
    bs = [x_of(r, (N, 3), np.float64) for r in range(N)]
    a, b = run(lambda x, y: gtf.grouped_reducescatter([x, y], op=gtf.Sum, postscale_factor=2.0),
               xs[R], bs[R])
    close(a, (np.sum(xs, 0) * 2.0)[block(rows, R)], f"{mode} grouped_reducescatter[0]")
    close(b, (np.sum(bs, 0) * 2.0)[block(N, R)], f"{mode} grouped_reducescatter[1]")
    assert b.dtype == np.float64, b.dtype
    us = [x_of(r, (r + 1, 2)) for r in range(N)]
    vs = [np.arange(r + 2, dtype=np.int32) + 7 * r for r in range(N)]
    u, v = run(lambda x, y: gtf.grouped_allgather([x, y]), us[R], vs[R])
    close(u, np.concatenate(us), f"{mode} grouped_allgather[0]")
    close(v, np.concatenate(vs), f"{mode} grouped_allgather[1]")
    assert v.dtype == np.int32, v.dtype
    same(f"{mode} grouped_allgather", u)
    # alltoall without splits returns the tensor alone (Horovod): rank r sends rows
    # [2p, 2p + 2) to rank p.
    y = run(lambda x: gtf.alltoall(x), x_of(R, (2 * N, 3)))
    assert not isinstance(y, list), "alltoall without splits must return one tensor"
    close(y, np.concatenate([x_of(q, (2 * N, 3))[2 * R:2 * R + 2] for q in range(N)]),
          f"{mode} alltoall even")
    y, got_splits = run(lambda x: gtf.alltoall(x, splits=[1] * N), x_of(R, (N, 2)))
    assert got_splits.dtype == np.int32, got_splits.dtype
    close(got_splits, np.ones(N, np.int32), f"{mode} alltoall splits")


def grad_of(mode, fn, xs, ups):
    def body(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            ys = fn(*xs)
        return tape.gradient(ys, list(xs), output_gradients=ups)
    xs = [tf.constant(x) for x in xs]
    out = tf.function(body)(*xs) if mode == "graph" else body(*xs)
    return [o.numpy() for o in out]


def check_gradients(mode):
    # reducescatter: y_r = post * op_j(pre * x_j)[block r]; rank j's gradient is
    # every rank's upstream block, times pre * post (/ N for Average).
    rows = 2 * N
    up = tf.constant(np.full((2, 2), R + 1.0, np.float32))
    want = np.repeat(np.arange(1, N + 1, dtype=np.float32), 2)[:, None] * np.ones((1, 2),
                                                                                np.float32)
    g, = grad_of(mode, lambda x: gtf.reducescatter(x, op=gtf.Sum, prescale_factor=2.0,
                                                    postscale_factor=3.0),
                 [np.ones((rows, 2), np.float32)], up)
    close(g, want * 6.0, f"{mode} d reducescatter sum scaled")
    g, = grad_of(mode, lambda x: gtf.reducescatter(x), [np.ones((rows, 2), np.float32)], up)
    close(g, want / N, f"{mode} d reducescatter avg")
    ga, gb = grad_of(mode, lambda x, y: gtf.grouped_reducescatter([x, y], op=gtf.Sum),
                     [np.ones((rows, 2), np.float32), np.ones((rows, 2), np.float32)],
                     [up, 2 * up])
    close(ga, want, f"{mode} d grouped_reducescatter[0]")
    close(gb, 2 * want, f"{mode} d grouped_reducescatter[1]")
    # grouped_allgather (as Horovod's allgather): own rows of the upstream averaged over ranks.
    tot = N * (N + 1) // 2
    ups = [np.arange(tot * 2, dtype=np.float32).reshape(tot, 2) * (r + 1) for r in range(N)]
    start = R * (R + 1) // 2
    g0, g1 = grad_of(mode, lambda x, y: gtf.grouped_allgather([x, y]),
                     [x_of(R, (R + 1, 2)), np.ones((1,), np.float32)],
                     [tf.constant(ups[R]), tf.constant(np.full((N,), R + 1.0, np.float32))])
    close(g0, np.mean(ups, 0)[start:start + R + 1], f"{mode} d grouped_allgather[0]")
    close(g1, [np.mean(np.arange(1, N + 1))], f"{mode} d grouped_allgather[1]")
    # alltoall without splits: rows sent to rank p get p's upstream (p + 1) back.
    g, = grad_of(mode, lambda x: gtf.alltoall(x), [x_of(R, (2 * N, 3))],
                 tf.constant(np.full((2 * N, 3), R + 1.0, np.float32)))
    close(g, np.repeat(np.arange(1, N + 1, dtype=np.float32), 2)[:, None] * np.ones((1, 3)),
          f"{mode} d alltoall")
    # allreduce with pre/postscale: the upstream reduced with the same op and scaling.
    g, = grad_of(mode, lambda x: gtf.allreduce(x, op=gtf.Sum, prescale_factor=2.0,
                                               postscale_factor=3.0),
                 [np.ones(3, np.float32)], tf.constant(np.full(3, R + 1.0, np.float32)))
    close(g, np.full(3, 6.0 * N * (N + 1) / 2), f"{mode} d allreduce scaled")
    same(f"{mode} d allreduce", g)


def check_broadcast_inplace():
    vs = [tf.Variable(x_of(R, (2, 3))), tf.Variable(np.int64(R))]
    out = gtf.broadcast_(vs, N - 1)
    close(vs[0].numpy(), x_of(N - 1, (2, 3)), "broadcast_ eager var")
    close(out[0].numpy(), x_of(N - 1, (2, 3)), "broadcast_ eager returned value")
    assert vs[1].numpy() == N - 1, vs[1].numpy()
    w = tf.Variable(np.full(4, R, np.float64))

    @tf.function
    def bcast():
        return gtf.broadcast_(w, 0)
    close(bcast().numpy(), np.zeros(4), "broadcast_ graph returned")
    close(w.numpy(), np.zeros(4), "broadcast_ graph var")
    try:
        gtf.broadcast_([tf.constant(1.0)], 0)
    except TypeError as e:
        assert "tf.Variable" in str(e), str(e)
    else:
        raise AssertionError("broadcast_ of a tensor did not raise")
    vs = [tf.Variable(x_of(R, (3,)))]
    # Horovod's positional (variables, root_rank, process_set, inplace)
    assert gtf.broadcast_variables(vs, 0, None, True) is None
    close(vs[0].numpy(), x_of(0, (3,)), "broadcast_variables inplace=True")


def check_objects():
    obj = {"rank": R, "data": list(range(R + 3)), "text": "r" * (R + 1)}
    got = gtf.broadcast_object(obj if R == N - 1 else None, root_rank=N - 1)
    assert got == {"rank": N - 1, "data": list(range(N + 2)), "text": "r" * N}, got
    everyone = gtf.allgather_object(obj)
    assert everyone == [{"rank": r, "data": list(range(r + 3)), "text": "r" * (r + 1)}
                        for r in range(N)], everyone
    fn = gtf.broadcast_object_fn(root_rank=0)
    assert fn(("first", R)) == ("first", 0)
    assert fn(np.arange(R + 1)).tolist() == [0]
    same("broadcast_object", pickle.dumps(got))
    # An unpicklable object (cloudpickle refuses a lock too): every rank
    # raises at once, quoting the error (the others stalled until
    # GRADFLOW_TIMEOUT), and the runtime stays usable.
    for call, culprit in [(lambda o: gtf.broadcast_object(o, root_rank=N - 1), N - 1),
                          (lambda o: gtf.allgather_object(o), 0)]:
        try:
            call(threading.Lock() if R == culprit else R)
        except (TypeError, gflow.GradflowError) as e:
            assert isinstance(e, TypeError if R == culprit else gflow.GradflowError), repr(e)
            assert "cannot pickle" in str(e) and (R == culprit or f" {culprit} " in str(e)), e
        else:
            raise AssertionError("an unpicklable object did not raise")
    assert gtf.allgather_object(R + 1) == list(range(1, N + 1))


def check_join():
    # Every rank but 0 joins at once; rank 0 first allreduces alone (the joined
    # ranks contribute zeros), then joins last: every rank sees 0 as the last.
    if R == 0:
        y = gtf.allreduce(tf.constant(x_of(0, (3,))), op=gtf.Sum, name="join.alone")
        close(y.numpy(), x_of(0, (3,)), "allreduce while the others joined")
    last = gtf.join()
    assert last.dtype == tf.int32 and int(last) == 0, last
    last = tf.function(gtf.join)()
    assert int(last) in range(N), last


def check_global_variables():
    try:
        gtf.broadcast_global_variables(0)
    except RuntimeError as e:
        assert "eager" in str(e), str(e)
    else:
        raise AssertionError("broadcast_global_variables under eager execution did not raise")
    with tf.Graph().as_default():
        a = tf.compat.v1.Variable(x_of(R, (2, 2)), name="a")
        b = tf.compat.v1.Variable(np.float64(R), name="b")
        op = gtf.broadcast_global_variables(N - 1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            got_a, got_b = sess.run([a, b])
    close(got_a, x_of(N - 1, (2, 2)), "broadcast_global_variables (graph) a")
    assert got_b == N - 1, got_b


def check_tapes(mode):
    # loss = sum(shared(x)) + sum(local(x)) with x rank-dependent: d kernel =
    # column sums of x tiled over the outputs, d bias = batch size.
    shared, local = keras.layers.Dense(3), keras.layers.Dense(2)
    x = tf.constant(x_of(R, (4, 5)) / 10.0)
    shared.build((None, 5))
    local.build((None, 5))
    colsum = [x_of(r, (4, 5)).sum(0) / 10.0 for r in range(N)]

    def grads(make_tape):
        def body():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(shared(x)) + tf.reduce_sum(local(x))
            t = make_tape(tape)
            return t.gradient(loss, shared.trainable_weights + local.trainable_weights)
        out = tf.function(body)() if mode == "graph" else body()
        return [g.numpy() for g in out]

    sk, sb, lk, lb = grads(lambda t: gtf.PartialDistributedGradientTape(t, local_layers=[local]))
    close(sk, np.tile(np.mean(colsum, 0)[:, None], (1, 3)), f"{mode} partial tape shared kernel",
          1e-5)
    close(sb, np.full(3, 4.0), f"{mode} partial tape shared bias")
    close(lk, np.tile(colsum[R][:, None] / N, (1, 2)), f"{mode} partial tape local kernel", 1e-5)
    close(lb, np.full(2, 4.0 / N), f"{mode} partial tape local bias")
    same(f"{mode} partial tape shared", sk)
    _, _, lk, _ = grads(lambda t: gtf.PartialDistributedGradientTape(
        t, local_layers=local, scale_local_gradients=False))
    close(lk, np.tile(colsum[R][:, None], (1, 2)), f"{mode} unscaled local kernel", 1e-5)
    # Horovod's positional order: (tape, device_dense, device_sparse, compression,
    # sparse_as_dense, op)
    sk, _, lk, _ = grads(lambda t: gtf.DistributedGradientTape(t, "", "", gtf.Compression.none,
                                                               False, gtf.Sum))
    close(sk, np.tile(np.sum(colsum, 0)[:, None], (1, 3)), f"{mode} tape Sum kernel", 1e-4)
    close(lk, np.tile(np.sum(colsum, 0)[:, None], (1, 2)), f"{mode} tape Sum local", 1e-4)


def check_tape_split_and_errors():
    v, w = tf.Variable(np.ones(2, np.float32)), tf.Variable(np.ones(3, np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * (R + 1.0)) + tf.reduce_sum(w * (R + 1.0))
    tape = gtf.DistributedGradientTape(tape)
    tape.register_local_source(w)
    local, shared = tape.get_local_and_global_gradients(loss, [v, w])
    assert [s is w for s, _ in local] == [True] and [s is v for s, _ in shared] == [True]
    close(shared[0][1].numpy(), np.full(2, (N + 1) / 2.0), "get_local_and_global shared")
    close(local[0][1].numpy(), np.full(3, (R + 1.0) / N), "get_local_and_global local")
    for bad, exc, text in [
            (lambda: gtf.DistributedGradientTape(tf.GradientTape(), groups=2), ValueError,
             "groups"),
            (lambda: gtf.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[v]),
             ValueError, "keras.layers.Layer"),
            (lambda: gtf.reducescatter(tf.ones((N, 2)), gtf.Sum), TypeError, "device_dense"),
            (lambda: gtf.grouped_allgather(tf.ones(2)), TypeError, "list"),
            (lambda: gtf.reducescatter(tf.ones(()), op=gtf.Sum), ValueError, "dimension")]:
        try:
            bad()
        except exc as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError(f"expected {exc.__name__} with {text!r}")


def check_queries():
    for mode, run in (("eager", lambda f: f()), ("graph", lambda f: tf.function(f)())):
        got = run(lambda: [gtf.rank_op(), gtf.size_op(), gtf.local_rank_op(), gtf.local_size_op()])
        assert [int(t) for t in got] == [R, N, gtf.local_rank(), gtf.local_size()], (mode, got)
        assert all(t.dtype == tf.int32 for t in got), mode
    opt = gtf.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    assert opt.backward_passes_per_step == 2 and type(opt).__name__ == "SGD"
    for bad, exc in [(lambda: gtf.size_op(process_set_id=1), ValueError),
                     (lambda: gtf.DistributedOptimizer(
                         tf.compat.v1.train.GradientDescentOptimizer(0.1)), TypeError)]:
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError(f"expected {exc.__name__}")


def check_second_order(mode):
    """An outer tape differentiates DistributedGradientTape's reduced
    gradients (a gradient penalty): the same value as with a plain tape on
    the same data everywhere (it was None: the reduction had no gradient)."""
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    w = tf.Variable(np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32))

    def penalty_grad(distributed):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = tf.reduce_sum(tf.sin(tf.matmul(x, w)))
            if distributed:
                inner = gtf.DistributedGradientTape(inner)
            g = inner.gradient(loss, [w])[0]
            penalty = tf.reduce_sum(g ** 2)
        return outer.gradient(penalty, w)

    run = penalty_grad if mode == "eager" else tf.function(penalty_grad)
    got, want = run(True), penalty_grad(False)
    assert got is not None, f"{mode}: no second-order gradient"
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    SAME.append(got.numpy().tobytes())


def check_bfloat16_scalars():
    """0-d bfloat16 eager tensors (np.asarray of one raises in TensorFlow)."""
    got = gtf.allreduce(tf.constant(1.5, tf.bfloat16), op=gtf.Sum, name="bf16.scalar")
    assert got.dtype == tf.bfloat16 and float(got) == 1.5 * N, got
    v = tf.Variable(tf.constant(float(R), tf.bfloat16))
    gtf.broadcast_variables([v], 0)
    assert float(v.numpy()) == 0.0
    with tf.GradientTape() as tape:
        loss = v * v + tf.constant(float(R + 1), tf.bfloat16) * v
    (g,) = gtf.DistributedGradientTape(tape).gradient(loss, [v])
    assert g.dtype == tf.bfloat16 and float(g) == (N + 1) / 2, g  # mean of 2v + (r + 1) at v = 0


def check_tape_float8():
    """Keras float8 in a tf.function tape step: the amax history's "gradient"
    (its new value) is the Max over the ranks (before 2026-11-29: their mean,
    3.87 where one rank's max |x| was 5.42); ranks identical."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.quantize("float8")
    opt = keras.optimizers.SGD(0.01)
    xs = [np.random.default_rng(r).normal(size=(16, 8)).astype(np.float32) * (r + 1)
          for r in range(N)]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(xs[R], training=True) ** 2)
        grads = gtf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step()
    newest = float(model.layers[0].inputs_amax_history.numpy()[0])
    assert newest == max(float(np.abs(x).max()) for x in xs), (newest, [np.abs(x).max() for x in xs])
    SAME.append(("tape float8", b"".join(v.numpy().tobytes() for v in model.variables)))


check_queries()
check_second_order("eager")
check_second_order("graph")
check_bfloat16_scalars()
check_scatter_gather("eager", eager)
check_scatter_gather("graph", graph)
check_gradients("eager")
check_gradients("graph")
check_broadcast_inplace()
check_objects()
check_global_variables()
check_tapes("eager")
check_tapes("graph")
check_tape_split_and_errors()
check_join()
check_tape_float8()
# Bitwise identity across ranks of everything that must agree.
everyone = gtf.allgather_object(SAME)
assert all(o == everyone[0] for o in everyone), "results differ between ranks"
print(f"rank {R}: tf hvd api OK", flush=True)
