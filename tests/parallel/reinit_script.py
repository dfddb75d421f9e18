"""shutdown() then init() again, several times, on every rank: collectives
work after each re-init (cached names, auto-names, every kind), calls between
shutdown() and init() raise a clear GradflowError, and a handle left pending
at shutdown() raises instead of aliasing a handle of the next runtime."""
import numpy as np

import gradflow as gf


def expect_error(fn, fragment):
    try:
        fn()
    except gf.GradflowError as e:
        assert fragment in str(e), f"expected {fragment!r} in {e}"
    else:
        raise AssertionError(f"no GradflowError mentioning {fragment!r}")


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


stale = None
for round_ in range(3):
    gf.init()
    assert gf.is_initialized()
    # The runtime's first handle; its name never matches, so it is pending at shutdown().
    lonely = gf.allreduce_async(np.ones(3), name=f"lonely.{gf.rank()}.{round_}")
    # If ids restarted per runtime, fresh.0 would reuse the stale handle's id
    # (the first of its runtime), and stale.wait() would consume its result.
    fresh = [gf.allreduce_async(np.full(4, float(i)), op=gf.Sum, name=f"fresh.{i}")
             for i in range(64)]
    if stale is not None:  # from the previous runtime: must not see a fresh one
        expect_error(stale.wait, "handle")
    for i, h in enumerate(fresh):
        np.testing.assert_array_equal(h.wait(), np.full(4, float(i) * gf.size()))
    for _ in range(2):  # the second pass takes the cached fast path
        check(round_)
    stale = lonely
    gf.shutdown()
    assert not gf.is_initialized()
    expect_error(lambda: gf.allreduce(np.ones(2), name="after.shutdown"), "init")
    expect_error(gf.rank, "init")

gf.init()
expect_error(stale.wait, "handle")

# A ProcessSet object outlives the runtime that numbered it: after shutdown()
# and init() its old id may be another set's. Using it raises (it used to run
# on whichever set now had the id), and registering it again works, also
# through init(process_sets=[...]) (which used to raise "already registered").
R, N = gf.rank(), gf.size()
if N == 1:  # a one-rank job has no set but the global one
    if R == 0:
        print(f"reinit OK on {N} ranks", flush=True)
    raise SystemExit(0)
first = gf.add_process_set(list(range(N - 1, -1, -1))[:max(1, N - 1)])  # e.g. [1, 2] of 3
gf.shutdown()
gf.init()
other = gf.add_process_set([0])  # takes the id `first` had
assert other.process_set_id == first.process_set_id, (other, first)
assert first.size() is None and first.rank() is None
try:
    gf.allreduce(np.ones(2), op=gf.Sum, process_set=first, name="stale.set")
except ValueError as e:
    assert "was registered before shutdown()" in str(e), e
else:
    raise AssertionError("a process set from the previous runtime was accepted")
assert gf.remove_process_set(first) is False and gf.is_initialized()
assert other.size() == 1  # untouched by the stale set's removal
gf.add_process_set(first)
if first.included():
    got = gf.allreduce(np.ones(2), op=gf.Sum, process_set=first, name="set.again")
    np.testing.assert_array_equal(got, np.full(2, first.size()))
gf.shutdown()
gf.init(process_sets=[first])
assert first.size() == len(first.ranks) and first.process_set_id not in (None, 0)
if first.included():
    got = gf.allreduce(np.ones(2), op=gf.Sum, process_set=first, name="set.init")
    np.testing.assert_array_equal(got, np.full(2, first.size()))
gf.barrier()
if gf.rank() == 0:
    print(f"reinit OK on {gf.size()} ranks", flush=True)
