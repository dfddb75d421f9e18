"""The program starts MPI itself (imports mpi4py.MPI) and its last rank ends
without calling init(). It does not exit: mpi4py's MPI_Finalize waits for
the other ranks. argv[1] "leave": the others call init() on COMM_WORLD, 2 s
later, so they wait for it (gradflowrun must stop the job within seconds;
it used to take GRADFLOW_TIMEOUT). "subset": the others call init() on the
ranks without it and allreduce, which must work (the leaving rank is not
waited for). Prints "rank R init returned" if init() returns."""
import sys
import time

import numpy as np
from mpi4py import MPI

import gradflow as gf

R, N = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
if R == N - 1:
    sys.exit(0)
if sys.argv[1] == "leave":
    time.sleep(2)  # the stop waits for the others to be in init()
    gf.init()
else:
    gf.init(list(range(N - 1)))
print(f"rank {R} init returned", flush=True)
got = gf.allreduce(np.arange(5, dtype=np.float64) * (R + 1), op=gf.Sum, name="x")
want = np.arange(5, dtype=np.float64) * sum(range(1, N))
assert np.array_equal(got, want), (got, want)
print(f"rank {R} allreduce OK", flush=True)
gf.shutdown()
