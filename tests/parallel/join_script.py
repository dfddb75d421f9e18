"""join(): a rank that ran out of data contributes zeros to the others'
allreduces until every rank has joined; join() returns the last rank to join."""
import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
steps = 3 + R  # rank r has 3 + r batches
for s in range(steps):
    got = gf.allreduce(np.full(5, 1.0, np.float32), op=gf.Sum, name=f"grad.{s % 2}")
    active = sum(1 for r in range(N) if s < 3 + r)  # ranks still training at step s
    np.testing.assert_array_equal(got, np.full(5, active, np.float32))
last = gf.join()
assert last == N - 1, last
# Normal operation afterwards.
np.testing.assert_array_equal(gf.allreduce(np.ones(2), op=gf.Sum, name="after"), np.full(2, N))
gf.barrier()
if R == 0:
    print("join OK on", N, "ranks")
