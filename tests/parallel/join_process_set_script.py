"""join() while other ranks run collectives on a process set that includes
the joined rank (native Note [Join and process sets]), default settings.

The last rank joins first. Meanwhile the others run, on a set that includes
it: a fresh allreduce, an allreduce whose name was cached by two good calls
before, an allgather and a broadcast. Each must raise within seconds on
every rank that ran it, naming the joined rank (before: a hang, since no
bounded wait fires and GRADFLOW_STALL_SHUTDOWN_TIME is off by default).
A set without the joined rank (3+ ranks) keeps working during the join.
After every rank has joined, the sets work again, equal to numpy and
bitwise equal on every member."""
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
assert N >= 2
LAST = N - 1
with_last = gf.add_process_set([0, LAST])            # includes the rank that joins
without_last = gf.add_process_set(list(range(N - 1))) if N >= 3 else None


def values(k=0):
    return np.arange(6, dtype=np.float32) * (R + 1) + k


def set_sum(ranks, k=0):
    return sum(np.arange(6, dtype=np.float32) * (r + 1) + k for r in ranks)


# Two good calls: "ps.cached" is then answered from the response cache.
if R in (0, LAST):
    for _ in range(2):
        got = gf.allreduce(values(), op=gf.Sum, name="ps.cached", process_set=with_last)
        np.testing.assert_array_equal(got, set_sum([0, LAST]))
gf.barrier()

if R == LAST:
    last = gf.join()
    assert last != LAST or N == 1, last  # somebody joined after this rank
else:
    if R == 0:
        cases = {
            "fresh allreduce": lambda: gf.allreduce(values(1), name="ps.fresh",
                                                    process_set=with_last),
            "cached allreduce": lambda: gf.allreduce(values(), op=gf.Sum, name="ps.cached",
                                                     process_set=with_last),
            "allgather": lambda: gf.allgather(values()[None, :], name="ps.gather",
                                              process_set=with_last),
            "broadcast": lambda: gf.broadcast(values(), 0, name="ps.bcast",
                                              process_set=with_last),
        }
        for what, fn in cases.items():
            t0 = time.monotonic()
            try:
                fn()
            except gf.GradflowError as e:
                msg = str(e)
            else:
                raise AssertionError(f"{what} on a set with a joined rank did not raise")
            took = time.monotonic() - t0
            assert "has called join()" in msg and "rank 1 " in msg, (what, msg)
            assert f"process set {with_last.process_set_id}" in msg, (what, msg)
            assert took < 15, (what, took)
    if without_last is not None:  # unaffected by the join
        got = gf.allreduce(values(2), op=gf.Sum, name="ps.other", process_set=without_last)
        np.testing.assert_array_equal(got, set_sum(range(N - 1), 2))
    gf.join()

# Everyone joined: the set works again, with the cached name too.
if R in (0, LAST):
    for name in ("ps.cached", "ps.after"):
        got = gf.allreduce(values(), op=gf.Sum, name=name, process_set=with_last)
        np.testing.assert_array_equal(got, set_sum([0, LAST]))
        both = gf.allgather(got[None, :], name=name + ".check", process_set=with_last)
        assert (both == both[0]).all()
gf.barrier()
print(f"join with process sets OK rank {R} of {N}", flush=True)
