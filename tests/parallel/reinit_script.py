"""shutdown() then init() again, several times, on every rank: collectives
work after each re-init (including cached names and a fresh autoname count),
a handle pending at shutdown raises, and calls between shutdown and init
raise a clear GradflowError."""
import numpy as np

import gradflow as gf


def check(round_):
    R, N = gf.rank(), gf.size()
    got = gf.allreduce(np.full(1000, R + round_, np.float64), op=gf.Sum, name="same.name")
    np.testing.assert_array_equal(got, np.full(1000, N * (N - 1) / 2 + N * round_))
    got = gf.allreduce(np.arange(5, dtype=np.int32) + R, op=gf.Max)  # auto-named
    np.testing.assert_array_equal(got, np.arange(5) + N - 1)
    ag = gf.allgather(np.full((R + 1, 2), R, np.int64), name="ag")
    assert ag.shape == (N * (N + 1) // 2, 2)
    b = gf.broadcast(np.full(3, R + 10.0), root_rank=N - 1, name="bc")
    np.testing.assert_array_equal(b, np.full(3, N - 1 + 10.0))
    gf.barrier()


for round_ in range(3):
    gf.init()
    assert gf.is_initialized()
    for _ in range(2):  # second pass takes the cached fast path
        check(round_)
    gf.shutdown()
    assert not gf.is_initialized()
    try:
        gf.allreduce(np.ones(2), name="after.shutdown")
    except gf.GradflowError as e:
        assert "init" in str(e), e
    else:
        raise AssertionError("allreduce after shutdown did not raise")

gf.init()
if gf.rank() == 0:
    print(f"reinit OK on {gf.size()} ranks", flush=True)
