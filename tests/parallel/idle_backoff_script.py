"""Idle backoff of the coordination loop (Note [Cycle pacing],
native/background_loop.h): a loop with nothing to do sleeps longer and
longer (GRADFLOW_IDLE_CYCLE_MAX), so a second of idling costs tens of
exchanges, not a thousand; and collectives after an idle spell, with ranks
arriving at different times, still give the exact sums on every rank."""
import os
import time

import numpy as np

import gradflow as gf

EXPECT = os.environ["EXPECT"]  # "backoff" or "steady"
gf.init()
R, N = gf.rank(), gf.size()
gf.allreduce(np.ones(4), op=gf.Sum, name="warm")
gf.barrier()
gf.reset_stats()
time.sleep(1.0)
cycles = gf.stats().get("negotiation.cycles", 0)
for i in range(3):
    time.sleep(0.15 * R)  # ranks arrive one after the other, after idling
    got = gf.allreduce(np.arange(1000, dtype=np.float32) * (R + 1), op=gf.Sum, name=f"after.{i}")
    want = np.arange(1000, dtype=np.float32) * (N * (N + 1) // 2)
    np.testing.assert_array_equal(got, want)
# Counts, not timings: ~55 exchanges at a 20 ms cap, ~1000 at a steady 1 ms.
if EXPECT == "backoff":
    assert cycles <= 150, f"rank {R}: {cycles} exchanges in 1 s of idling with the backoff"
else:
    assert cycles >= 250, f"rank {R}: only {cycles} exchanges in 1 s at a steady cycle"
gf.barrier()
print(f"idle backoff OK on rank {R} of {N}: {cycles:.0f} cycles ({EXPECT})", flush=True)
