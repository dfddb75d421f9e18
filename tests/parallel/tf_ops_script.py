# tests/parallel/tf_ops_script.py — SPMD script (run by test_tensorflow.py under
# mpiexec): every gradflow.tensorflow op eagerly and in tf.function against a
# numpy closed form in rank and index, their gradients, DistributedGradientTape,
# broadcast_variables and the cross-rank mismatch error. Exits non-zero on failure.

from _tf_common import tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.tensorflow as gtf  # noqa: E402

gtf.init()
R, N = gtf.rank(), gtf.size()


def close(a, b, what, tol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert np.allclose(a, b, atol=tol, rtol=tol), f"{what}: {a} != {b}"


def x_of(r, shape=(3, 4), dtype=np.float32):
    """Rank r's input: a closed form in rank and index."""
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * r).astype(dtype)


def rows_of(r):  # allgather: rank r contributes r + 1 rows
    return (np.arange((r + 1) * 2).reshape(r + 1, 2) + 100 * r).astype(np.float32)


def check_ops(mode, run):
    xs = [x_of(r) for r in range(N)]
    close(run(lambda x: gtf.allreduce(x), x_of(R)), np.mean(xs, 0), f"{mode} allreduce avg")
    close(run(lambda x: gtf.allreduce(x, op=gtf.Sum), x_of(R)), np.sum(xs, 0), f"{mode} allreduce sum")
    close(run(lambda x: gtf.allreduce(x, op=gtf.Max), x_of(R)), np.max(xs, 0), f"{mode} allreduce max")
    for dt in (np.float64, np.int32, np.int64):
        got = run(lambda x: gtf.allreduce(x, op=gtf.Sum), x_of(R, dtype=dt))
        assert got.dtype == dt, f"{mode} allreduce dtype {got.dtype}"
        close(got, np.sum([x_of(r, dtype=dt) for r in range(N)], 0), f"{mode} allreduce {dt}")
    close(run(lambda x: gtf.allreduce(x, op=gtf.Sum, prescale_factor=2.0, postscale_factor=0.5),
              x_of(R)), np.sum(xs, 0), f"{mode} allreduce scaled")
    # tf.IndexedSlices (rank r's row r): pre/postscale apply as for a dense
    # tensor (they were dropped, as Horovod drops them: 2/3 of this value);
    # int32 values are scaled in double and truncated toward zero, as dense.
    rows = np.concatenate([x_of(r, (1, 4)) + 1 for r in range(N)])  # row r: rank r's values
    for op, dt, exp in ((gtf.Sum, np.float32, rows * 1.5), (gtf.Average, np.float32, rows * 1.5 / N),
                        (gtf.Sum, np.int32, np.trunc(np.trunc(rows * 0.5) * 3.0))):
        def sliced(v, op=op):
            s = tf.IndexedSlices(v, tf.constant([R]), tf.constant([N, 4]))
            return tf.convert_to_tensor(gtf.allreduce(s, op=op, prescale_factor=0.5,
                                                      postscale_factor=3.0))
        got = run(sliced, rows[R:R + 1].astype(dt))
        assert got.dtype == dt, f"{mode} IndexedSlices dtype {got.dtype}"
        close(got, exp, f"{mode} allreduce IndexedSlices {op!r} {dt.__name__} scaled")
    g = run(lambda a, b: gtf.grouped_allreduce([a, b], op=gtf.Sum), x_of(R), x_of(R, (5,)))
    close(g[0], np.sum(xs, 0), f"{mode} grouped[0]")
    close(g[1], np.sum([x_of(r, (5,)) for r in range(N)], 0), f"{mode} grouped[1]")
    close(run(lambda x: gtf.allgather(x), rows_of(R)), np.concatenate([rows_of(r) for r in range(N)]),
          f"{mode} allgather")
    close(run(lambda x: gtf.allgather(x), np.float32(R)), np.arange(N, dtype=np.float32),
          f"{mode} allgather scalar")
    close(run(lambda x: gtf.broadcast(x, N - 1), x_of(R)), x_of(N - 1), f"{mode} broadcast")
    rs_in = [x_of(r, (2 * N + 1, 2)) for r in range(N)]
    full = np.sum(rs_in, 0)
    lo = sum(2 + (1 if p < 1 else 0) for p in range(R))
    close(run(lambda x: gtf.reducescatter(x, op=gtf.Sum), rs_in[R]),
          full[lo:lo + 2 + (1 if R < 1 else 0)], f"{mode} reducescatter")
    # compression=fp16: each peer's 1 + 2**-20 arrives rounded to 1, the
    # owner's own stays exact (an ignored compression would keep them all)
    wide = np.full((N * 3, 2), 1 + 2 ** -20, np.float32)
    got = run(lambda x: gtf.reducescatter(x, op=gtf.Sum, compression=gtf.Compression.fp16), wide)
    assert np.array_equal(got, np.full((3, 2), N + 2 ** -20, np.float32)), f"{mode} rs fp16 {got}"
    # alltoall: rank r sends p + 1 rows (valued 1000 r + p) to rank p.
    send = np.concatenate([np.full((p + 1, 2), 1000 * R + p, np.float32) for p in range(N)])
    y, got_splits = run(lambda x: gtf.alltoall(x, splits=[p + 1 for p in range(N)]), send)
    close(got_splits, np.full(N, R + 1), f"{mode} alltoall splits")
    close(y, np.concatenate([np.full((R + 1, 2), 1000 * q + R, np.float32) for q in range(N)]),
          f"{mode} alltoall")
    # Fractional splits raise (a cast used to truncate [1.5, 1] to [1, 1]).
    # Inside tf.function at run time, where every rank fails the op (arguments.py):
    # TensorFlow reports the TypeError or ValueError as InvalidArgumentError.
    bad_argument = (TypeError, ValueError, tf.errors.InvalidArgumentError)
    try:
        run(lambda x: gtf.alltoall(x, splits=[1.5] + [1] * (N - 1)), np.ones((N, 2), np.float32))
    except bad_argument as e:
        assert "splits must be integers" in str(e), e
        assert mode == "graph" or isinstance(e, TypeError), e
    else:
        raise AssertionError(f"{mode} alltoall with splits [1.5, ...] did not raise")
    # A root that is not a whole number raises (int() took 1.5 as rank 1).
    for root in (0.5, "0"):
        try:
            run(lambda x: gtf.broadcast(x, root), np.ones(2, np.float32))
        except bad_argument as e:
            assert "root_rank must be a whole rank number" in str(e), e
            assert mode == "graph" or isinstance(e, ValueError), e
        else:
            raise AssertionError(f"{mode} broadcast with root_rank={root!r} did not raise")


def eager(fn, *args):
    out = fn(*[tf.constant(a) for a in args])
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def graph(fn, *args):
    out = tf.function(fn)(*[tf.constant(a) for a in args])
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) else out.numpy()


def check_static_shapes():
    @tf.function
    def f(x):
        y = gtf.allreduce(x)
        assert y.shape == x.shape, y.shape
        z = gtf.allgather(x)
        assert z.shape.as_list() == [None, 4], z.shape
        w = gtf.reducescatter(tf.concat([x] * N, 0))
        assert w.shape.as_list() == [3, 4], w.shape
        return y, z, w
    f(tf.constant(x_of(R)))


def grads(mode, fn, x, upstream):
    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x, output_gradients=upstream)
    out = tf.function(body)(tf.constant(x)) if mode == "graph" else body(tf.constant(x))
    return out.numpy()


def check_gradients(mode):
    up = tf.constant(x_of(R) + 1)
    ups = [x_of(r) + 1 for r in range(N)]
    close(grads(mode, lambda x: gtf.allreduce(x), x_of(R), up), np.mean(ups, 0), f"{mode} d allreduce avg")
    close(grads(mode, lambda x: gtf.allreduce(x, op=gtf.Sum), x_of(R), up), np.sum(ups, 0),
          f"{mode} d allreduce sum")
    tot = sum(r + 1 for r in range(N))
    up_g = tf.constant(np.arange(tot * 2, dtype=np.float32).reshape(tot, 2) * (R + 1))
    summed = np.sum([np.arange(tot * 2, dtype=np.float32).reshape(tot, 2) * (r + 1) for r in range(N)], 0)
    start = sum(r + 1 for r in range(R))
    # Horovod's gradients: allgather and broadcast average the upstream gradient.
    close(grads(mode, lambda x: gtf.allgather(x), rows_of(R), up_g),
          summed[start:start + R + 1] / N, f"{mode} d allgather")
    want = np.mean(ups, 0) if R == 0 else np.zeros_like(ups[0])
    close(grads(mode, lambda x: gtf.broadcast(x, 0), x_of(R), up), want, f"{mode} d broadcast")
    rs_up = tf.constant(np.full((1, 2), R + 1, np.float32))
    close(grads(mode, lambda x: gtf.reducescatter(x, op=gtf.Sum), np.ones((N, 2), np.float32), rs_up),
          np.array([[r + 1] * 2 for r in range(N)], np.float32), f"{mode} d reducescatter")


def check_tape(mode):
    w = tf.Variable(np.full((3,), 1.0 + R, np.float32))
    emb = tf.Variable(np.ones((5, 2), np.float32))

    def step(sparse_as_dense):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w * (R + 1)) + tf.reduce_sum(tf.gather(emb, [R, R]))
        tape = gtf.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        return tape.gradient(loss, [w, emb])

    fn = tf.function(step) if mode == "graph" else step
    want_w = np.mean([2 * (1.0 + r) * (r + 1) * np.ones(3) for r in range(N)], 0)
    want_emb = np.zeros((5, 2))
    for r in range(N):
        want_emb[r] += 2.0 / N
    for dense in (False, True):
        gw, gemb = fn(dense)
        close(gw, want_w, f"{mode} tape dense grad")
        assert isinstance(gemb, tf.IndexedSlices) != dense, f"{mode} tape sparse type {type(gemb)}"
        close(tf.convert_to_tensor(gemb), want_emb, f"{mode} tape IndexedSlices grad")


def check_broadcast_variables():
    vs = [tf.Variable(x_of(R)), tf.Variable(np.int64(R)), tf.Variable(x_of(R, (7,), np.float64))]
    gtf.broadcast_variables(vs, root_rank=N - 1)
    for v, want in zip(vs, [x_of(N - 1), np.int64(N - 1), x_of(N - 1, (7,), np.float64)]):
        close(v.numpy(), want, "broadcast_variables eager")
    ws = [tf.Variable(x_of(R))]

    @tf.function
    def bcast():
        gtf.broadcast_variables(ws, 0)
    bcast()
    close(ws[0].numpy(), x_of(0), "broadcast_variables graph")
    # Keras 3 variables (what model.variables lists under TensorFlow >= 2.16):
    # Horovod's TF2 recipe broadcast_variables(model.variables, 0), eagerly
    # and inside the first tf.function step (before: TypeError).
    from _tf_common import keras
    for mode in ("eager", "graph"):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.layers[0].kernel.assign(x_of(R, (3, 2)))
        model.layers[0].bias.assign(x_of(R + 5, (2,)))
        if mode == "eager":
            gtf.broadcast_variables(model.variables, root_rank=N - 1)
        else:
            @tf.function
            def first_step():  # Horovod's TF2 example broadcasts here
                gtf.broadcast_variables(model.variables, root_rank=N - 1)
            first_step()
        close(model.layers[0].kernel.numpy(), x_of(N - 1, (3, 2)), f"Keras variables {mode}")
        close(model.layers[0].bias.numpy(), x_of(N + 4, (2,)), f"Keras variables {mode}")
    model.layers[0].kernel.assign(x_of(R, (3, 2)))
    one = gtf.broadcast_(model.layers[0].kernel, 0)  # a single Keras variable
    close(one.numpy(), x_of(0, (3, 2)), "broadcast_ of one Keras variable")


def check_mismatch():
    try:
        gtf.allreduce(tf.zeros([R + 1]), name="mismatched.tensor")
    except Exception as e:  # every rank must get the core's signature error
        msg = str(e)
        assert "mismatched.tensor" in msg and "rank 0" in msg and "rank 1" in msg, msg
    else:
        raise AssertionError("mismatched shapes did not raise")
    try:
        tf.function(lambda x: gtf.allreduce(x, name="mismatched.graph"))(tf.zeros([R + 1]))
    except Exception as e:
        assert "mismatched.graph" in str(e), str(e)
    else:
        raise AssertionError("mismatched shapes in tf.function did not raise")


def check_xla_rejected():
    try:
        tf.function(lambda x: gtf.allreduce(x), jit_compile=True)(tf.ones([2]))
    except Exception as e:  # autograph wraps it in a StagingError
        assert "cannot run under XLA" in str(e), str(e)
    else:
        raise AssertionError("allreduce under XLA did not raise")


check_ops("eager", eager)
check_ops("graph", graph)
check_static_shapes()
check_gradients("eager")
check_gradients("graph")
check_tape("eager")
check_tape("graph")
check_broadcast_variables()
check_xla_rejected()
if N > 1:
    check_mismatch()
print(f"rank {R}: tf ops OK", flush=True)
