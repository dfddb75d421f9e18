"""SPMD checks that bad input raises a clear GradflowError on every rank (no
hang, no crash) and that the runtime keeps working afterwards."""
import pickle
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()


def expect_error(fn, *fragments, exc=gf.GradflowError):
    try:
        fn()
    except exc as e:
        msg = str(e)
        for f in fragments:
            assert f in msg, f"expected {f!r} in error message: {msg}"
        return msg
    raise AssertionError(f"no {exc.__name__} raised; wanted one mentioning {fragments}")


if N > 1:
    # Same name, different shapes / dtypes / ops on different ranks.
    shape = (3,) if R == 0 else (4,)
    expect_error(lambda: gf.allreduce(np.ones(shape, np.float32), name="bad.shape"),
                 "bad.shape", "rank 0", "shape=[3]", "shape=[4]")
    dtype = np.float32 if R == 0 else np.float64
    expect_error(lambda: gf.allreduce(np.ones(3, dtype), name="bad.dtype"), "bad.dtype", "float64")
    op = gf.Sum if R == 0 else gf.Max
    expect_error(lambda: gf.allreduce(np.ones(3, np.float32), op=op, name="bad.op"), "bad.op", "op=max")
    root = 0 if R == 0 else 1
    expect_error(lambda: gf.broadcast(np.ones(2), root, name="bad.root"), "bad.root", "root=")
    expect_error(lambda: gf.allgather(np.ones((2, 3 + (R > 0))), name="bad.ag"), "bad.ag", "trailing_shape")
    # Scale factors are compared exactly (a 6-digit text made 1.0 and
    # 1.000004 agree, and rank 0's was used everywhere), for reducescatter too
    # (it used to compare none and apply rank 0's).
    pre = 1.0 if R == 0 else 1.000004
    expect_error(lambda: gf.allreduce(np.ones(3), prescale_factor=pre, name="bad.pre"),
                 "bad.pre", "prescale=1 ", "prescale=1.000004")
    expect_error(lambda: gf.reducescatter(np.ones((N, 2)), prescale_factor=1.0 + R, name="rs.pre"),
                 "rs.pre", "prescale=1 ", "prescale=2")
    expect_error(lambda: gf.reducescatter(np.ones((N, 2)), postscale_factor=1.0 + R,
                                          name="rs.post"), "rs.post", "postscale=2")
    wire = gf.Compression.fp16 if R == 0 else None
    expect_error(lambda: gf.reducescatter(np.ones((N, 2), np.float32), compression=wire,
                                          name="rs.wire"), "rs.wire", "wire=fp16")
    np.testing.assert_array_equal(gf.reducescatter(np.ones((N, 2)), op=gf.Sum, prescale_factor=0.1,
                                                   name="rs.same"), np.full((1, 2), 0.1 * N))
    # Names that never match: the stall inspector fails them on every rank.
    t0 = time.time()
    expect_error(lambda: gf.allreduce(np.ones(2), name=f"lonely.{R}"), f"lonely.{R}", "missing on ranks")
    assert time.time() - t0 < 30, "stall shutdown took too long"

# Errors detected on the submitting rank. A name is in flight until its
# collective completes, which cannot happen before every rank submitted it:
# the other ranks submit "dup" only after rank 0 tried it twice. (At one rank
# a collective may complete before the caller's next line, so there a second
# submit cannot be made to find the first still in flight: not checked.)
if N > 1:
    if R == 0:
        h = gf.allreduce_async(np.ones(5), name="dup")
        expect_error(lambda: gf.allreduce_async(np.ones(5), name="dup"), "dup", "submitted twice")
    gf.allreduce(np.ones(1), name="dup.tried")
    if R != 0:
        h = gf.allreduce_async(np.ones(5), name="dup")
    np.testing.assert_array_equal(h.wait(), np.ones(5))
# Errors detected on the submitting rank (identical on every rank here).
expect_error(lambda: gf.allreduce(np.ones(3, bool), op=gf.Sum, name="sum.bool"), "bool")
expect_error(lambda: gf.allreduce(np.ones(3, bool), op=gf.Average, name="avg.bool"), "bool")
# Scaling a bool tensor is not computable (integer tensors scale as in
# Horovod): refused at submit, locally, as a ValueError (and a
# GradflowError); it used to kill the background loop on every rank.
for kw in ({"prescale_factor": 2}, {"postscale_factor": 0.5}):
    expect_error(lambda: gf.allreduce(np.ones(4, bool), op=gf.Max, **kw), "scale", "bool",
                 exc=ValueError)
    expect_error(lambda: gf.allreduce_async(np.ones(4, bool), op=gf.Max, **kw), "scale",
                 exc=gf.GradflowError)
np.testing.assert_array_equal(gf.allreduce(np.arange(4, dtype=np.int32), op=gf.Sum),
                              np.arange(4) * N)
expect_error(lambda: gf.allreduce(np.ones(3, np.complex64), name="complex"), "unsupported dtype", exc=TypeError)
expect_error(lambda: gf.broadcast(np.ones(2), N + 3, name="root.range"), "out of range")
# A root that is not a whole number raises (int() took 1.5 and "1" as rank
# 1, 0.7 as rank 0: the broadcast came from another rank than asked).
for bad_root in (N - 0.5, 0.7, "0"):
    expect_error(lambda: gf.broadcast(np.ones(2), bad_root, name="root.frac"), "whole rank",
                 exc=ValueError)
    expect_error(lambda: gf.collectives.broadcast_pickled(
        R, bad_root, "root.frac.size", "root.frac.data", None, pickle.dumps, pickle.loads),
        "whole rank",
        exc=ValueError)
np.testing.assert_array_equal(gf.broadcast(np.full(2, R), np.float64(N - 1), name="root.whole"),
                              np.full(2, N - 1))
# A name with a lone surrogate (os.fsdecode of undecodable bytes) has no
# UTF-8 form: a ValueError saying so, not pybind11's "incompatible function
# arguments" TypeError; unicode names work.
expect_error(lambda: gf.allreduce(np.ones(2), name="grad.\udcff"), "not valid Unicode",
             exc=ValueError)
np.testing.assert_array_equal(gf.allreduce(np.ones(2), op=gf.Sum, name="grad.é.权重"),
                              np.full(2, N))
try:
    import torch

    import gradflow.torch as gt
except ImportError:
    torch = None
if torch is not None:
    expect_error(lambda: gt.broadcast(torch.ones(2), N - 0.5, name="root.frac.t"), "whole rank",
                 exc=ValueError)
    expect_error(lambda: gt.broadcast_(torch.ones(2), 0.7, name="root.frac.t_"), "whole rank",
                 exc=ValueError)
    expect_error(lambda: gt.broadcast_object(R, N - 0.5), "whole rank", exc=ValueError)
expect_error(lambda: gf.allreduce(np.ones(2), op=17), "unknown reduce op", exc=ValueError)
expect_error(lambda: gf.alltoall(np.ones(4), splits=[1] * (N + 1), name="a2a.len"), "splits")
expect_error(lambda: gf.alltoall(np.ones(4), splits=[5] + [0] * (N - 1), name="a2a.sum"),
             "more than the first dimension")  # Horovod's ValueError, at submit
expect_error(lambda: gf.alltoall(np.ones(4), splits=[1] + [0] * (N - 1), name="a2a.short"),
             "do not sum")  # Horovod sends only those rows; gradflow refuses (horovod_compat.md)

# Still healthy after all of that.
np.testing.assert_array_equal(gf.allreduce(np.full(7, R, np.int64), op=gf.Sum, name="after"),
                              np.full(7, N * (N - 1) // 2))
gf.barrier()
if R == 0:
    print("errors OK on", N, "ranks")
