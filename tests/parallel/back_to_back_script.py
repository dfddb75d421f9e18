"""Synchronous collectives called back to back (Note [Cycle pacing],
native/background_loop.h): after a cycle that ran work, a rank with nothing
pending waits for its next submit before the next exchange, so a series of
calls costs one exchange per call, not two (the second one empty), even
when the caller does some work between calls (here 0.3 ms, well inside
the test's 5 ms cycle time). Counts, not timings; and every result is
checked against numpy (allreduces, and an allgather every fourth call)."""
import time

import numpy as np

import gradflow as gf

CALLS = 200
gf.init()
R, N = gf.rank(), gf.size()
gf.allreduce(np.ones(4, np.float32), op=gf.Sum, name="warm")
gf.barrier()
gf.reset_stats()
base = np.arange(1024, dtype=np.float32)
for i in range(CALLS):
    if i % 4 == 3:  # a different collective in the series: the same pacing
        got = gf.allgather(np.full(3, R + i, np.int64), name="b2b.gather")
        want = np.concatenate([np.full(3, r + i, np.int64) for r in range(N)])
    else:
        # Integer-valued float32: the sum is exact in any order.
        got = gf.allreduce(base * (R + 1) + i, op=gf.Sum, name="b2b")
        want = base * (N * (N + 1) // 2) + N * i
    np.testing.assert_array_equal(got, want, err_msg=f"rank {R}, call {i}")
    until = time.perf_counter() + 0.0003  # the caller's own work between calls
    while time.perf_counter() < until:
        pass
st = gf.stats()
cycles, with_work = st.get("negotiation.cycles", 0), st.get("negotiation.cycles_with_work", 0)
assert with_work == CALLS, f"rank {R}: {with_work} cycles with work for {CALLS} calls"
# Before the wait after work: ~2 exchanges per call (one of them empty).
assert cycles <= 1.2 * CALLS, f"rank {R}: {cycles:.0f} exchanges for {CALLS} back-to-back calls"
gf.barrier()
print(f"back to back OK on rank {R} of {N}: {cycles / CALLS:.2f} exchanges per call", flush=True)
