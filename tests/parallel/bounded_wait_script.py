"""Every wait is bounded, with default stall settings (argv[1] is the
GRADFLOW_TIMEOUT the test set): collectives that can never complete (names
that differ between ranks, on the slow and the cached path) fail on every
rank once every rank has waited GRADFLOW_TIMEOUT; a rank that is merely busy
(the others wait for it) is not an error; join() after a refused collective
leaves the runtime usable (issue 13 item 4)."""
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
TIMEOUT = float(sys.argv[1])

gf.allreduce(np.ones(3), name="cached")  # gets a cache bit
for what in ("slow", "cached"):
    name = f"mismatch.{R}" if what == "slow" else ("cached" if R == 0 else f"other.{R}")
    t0 = time.time()
    try:
        gf.allreduce(np.ones(3), name=name)
        raise AssertionError(f"{what}: a collective that cannot complete returned")
    except gf.GradflowError as e:
        took = time.time() - t0
        assert "GRADFLOW_TIMEOUT" in str(e) and name in str(e), e
        assert TIMEOUT * 0.9 <= took < TIMEOUT * 4 + 10, (what, took)

# A busy rank (2 x the timeout) while the others wait: not an error.
if R == 0:
    time.sleep(2 * TIMEOUT)
np.testing.assert_array_equal(gf.allreduce(np.ones(2), op=gf.Sum, name="busy"), np.full(2, N))

# The reproduction: rank 0 joins; the others try an allgather that
# is refused, then join; the next unnamed collective must work.
if R == 0:
    ret = gf.join()
else:
    try:
        gf.allgather(np.zeros((17, 17, 17), np.float32))
        raise AssertionError("allgather with a joined rank was not refused")
    except gf.GradflowError as e:
        assert "join()" in str(e), e
    ret = gf.join()
from gradflow.torch import allgather_object  # noqa: E402

# Rank 0 joined first (the allgather is refused only once it has); the
# others' order is theirs.
assert allgather_object(ret) == [ret] * N and 0 < ret < N, ret
gf.barrier()
if R == 0:
    print("bounded waits OK on", N, "ranks")
