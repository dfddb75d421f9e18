"""init(comm=...) on an mpi4py sub-communicator: even and odd world ranks
form two independent gradflow jobs. With GRADFLOW_ALLREDUCE_ALGO set, that
algorithm must run (stats) on the sub-communicator, fp32 and 16-bit wire,
twice per window size (two-sync alternates two RMA windows) and after a
window has to grow."""
import os

import numpy as np
from mpi4py import MPI

import gradflow as gf

ALGO = os.environ.get("GRADFLOW_ALLREDUCE_ALGO", "ring")
world = MPI.COMM_WORLD
sub = world.Split(color=world.rank % 2, key=world.rank)
gf.init(comm=sub)
assert gf.size() == sub.size and gf.rank() == sub.rank, (gf.size(), gf.rank())
members = [r for r in range(world.size) if r % 2 == world.rank % 2]
got = gf.allreduce(np.full(1000, world.rank, np.int64), op=gf.Sum, name="sub")
np.testing.assert_array_equal(got, np.full(1000, sum(members)))
gathered = gf.allgather(np.array([world.rank]), name="members")
np.testing.assert_array_equal(gathered, members)
for count in (1000, 1000, 300_000, 300_000, 10):  # windows alternate, grow, are reused
    for comp, wire in ((gf.Compression.fp32, "fp32"), (gf.Compression.bf16, "bf16")):
        before = gf.stats().get(f"allreduce.count.{ALGO}.{wire}", 0)
        x = np.arange(count, dtype=np.float32) % 64 + world.rank  # exact in bf16 sums
        got = gf.allreduce(x, op=gf.Sum, name=f"sub.{count}.{wire}", compression=comp)
        want = sum(np.arange(count, dtype=np.float32) % 64 + r for r in members)
        np.testing.assert_array_equal(got, want)
        ran = gf.stats().get(f"allreduce.count.{ALGO}.{wire}", 0) - before
        assert ran == 1, (ALGO, wire, gf.stats())
# The user's own traffic on the parent communicator is not disturbed.
assert world.allreduce(1) == world.size
gf.shutdown()
print("subcomm OK", world.rank)
