"""init(comm=...) on an mpi4py sub-communicator: even and odd world ranks
form two independent gradflow jobs."""
import numpy as np
from mpi4py import MPI

import gradflow as gf

world = MPI.COMM_WORLD
sub = world.Split(color=world.rank % 2, key=world.rank)
gf.init(comm=sub)
assert gf.size() == sub.size and gf.rank() == sub.rank, (gf.size(), gf.rank())
members = [r for r in range(world.size) if r % 2 == world.rank % 2]
got = gf.allreduce(np.full(1000, world.rank, np.int64), op=gf.Sum, name="sub")
np.testing.assert_array_equal(got, np.full(1000, sum(members)))
gathered = gf.allgather(np.array([world.rank]), name="members")
np.testing.assert_array_equal(gathered, members)
# The user's own traffic on the parent communicator is not disturbed.
assert world.allreduce(1) == world.size
gf.shutdown()
print("subcomm OK", world.rank)
