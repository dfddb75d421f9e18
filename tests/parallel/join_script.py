"""join(): a rank that ran out of data contributes the op's identity (zeros
for sum and average) to the others' allreduces until every rank has joined; join() returns the rank that joined
last, whatever the order; every other collective kind is refused on every
rank meanwhile and the runtime (unnamed collectives included) works after.
argv[1]: join order, e.g. "2,0,1" (rank 2 first, rank 1 last), or "together"."""
import sys

import numpy as np

import gradflow as gf
from gradflow.torch import allgather_object, broadcast_object

gf.init()
R, N = gf.rank(), gf.size()
try:
    import ml_dtypes  # numpy's bfloat16
    BF16 = [ml_dtypes.bfloat16]
except ImportError:
    BF16 = []


def expect_refused(fn, what):
    try:
        fn()
    except gf.GradflowError as e:
        assert "join()" in str(e), e
        return
    raise AssertionError(f"{what} with a joined rank was not refused")


if sys.argv[1] == "together":
    last = gf.join()  # every rank at once, nothing pending
    assert 0 <= last < N, last
else:
    order = [int(x) for x in sys.argv[1].split(",")]
    assert sorted(order) == list(range(N)), order
    pos = order.index(R)
    # Unnamed on purpose: ranks that join early skip some, so their
    # auto-name counters fall behind (join() must realign them). Step s can
    # only complete once the rank at position s-1 has joined, which fixes
    # the order in which ranks join.
    for s in range(pos + 1):
        got = gf.allreduce(np.full(5, 1.0 + s, np.float32), op=gf.Sum)
        np.testing.assert_array_equal(got, np.full(5, (1.0 + s) * (N - s), np.float32))
    if pos == N - 1 and N > 1:
        # The last rank still works while every other rank has joined:
        # allreduce sees zeros from them; anything else is refused.
        got = gf.allreduce(np.arange(4, dtype=np.float64), op=gf.Average)
        np.testing.assert_array_equal(got, np.arange(4) / N)
        # Min / max / product see the op's identity from a joined rank, so
        # only the working rank's values count (zeros made them 0, and
        # Horovod's zeros still do): per dtype, submitted together so the
        # core fuses them, and a product's prescale applied once.
        x = np.array([5, -3, 2], np.float64)
        for op in (gf.Min, gf.Max, gf.Product):
            dts = ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"] + BF16
            src = [np.abs(x) if dt == "uint8" else x for dt in dts]
            hs = [gf.allreduce_async(v.astype(dt), op=op, name=f"join.{op}.{dt}")
                  for v, dt in zip(src, dts)]
            for h, v, dt in zip(hs, src, dts):
                got = np.asarray(h.wait(), np.float64)
                np.testing.assert_array_equal(got, v, err_msg=f"{op} {dt}")
        for op, want in ((gf.Min, [True, False]), (gf.Max, [True, False])):
            got = gf.allreduce(np.array([True, False]), op=op, name=f"join.bool.{op}")
            np.testing.assert_array_equal(got, want, err_msg=f"bool {op}")
        got = gf.allreduce(np.full(3, 2.0), op=gf.Product, prescale_factor=3.0, name="join.prod")
        np.testing.assert_array_equal(got, np.full(3, 6.0))
        expect_refused(lambda: gf.allgather(np.zeros((17, 17, 17), np.float32)), "allgather")
        expect_refused(lambda: gf.broadcast(np.zeros(3), R), "broadcast")
        expect_refused(lambda: gf.reducescatter(np.zeros((N, 2)), op=gf.Sum), "reducescatter")
        expect_refused(lambda: gf.alltoall(np.zeros(N)), "alltoall")
        expect_refused(gf.barrier, "barrier")
        expect_refused(lambda: allgather_object(R), "allgather_object")
        expect_refused(lambda: broadcast_object(R, root_rank=R), "broadcast_object")
    last = gf.join()
    assert last == order[-1], (last, order)
# Every rank got the same answer, and every collective kind (unnamed ones
# included) works again and matches numpy.
assert allgather_object(last) == [last] * N
np.testing.assert_array_equal(gf.allreduce(np.ones(2), op=gf.Sum), np.full(2, N))
np.testing.assert_array_equal(gf.allgather(np.full((R + 1, 2), R)),
                              np.concatenate([np.full((r + 1, 2), r) for r in range(N)]))
np.testing.assert_array_equal(gf.broadcast(np.full(3, R), N - 1), np.full(3, N - 1))
np.testing.assert_array_equal(gf.reducescatter(np.ones((N, 2)), op=gf.Sum), np.full((1, 2), N))
got, splits = gf.alltoall(np.full(N, R))
np.testing.assert_array_equal(got, np.arange(N))
assert broadcast_object({"r": R}, root_rank=0) == {"r": 0}
gf.barrier()
# A second round of joins works the same way.
assert gf.join() in range(N)
np.testing.assert_array_equal(gf.allreduce(np.ones(2), op=gf.Sum, name="after"), np.full(2, N))
if R == 0:
    print("join OK on", N, "ranks, order", sys.argv[1])
