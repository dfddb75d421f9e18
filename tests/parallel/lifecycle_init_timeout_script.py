"""The last rank exits before init(); the others' init() must raise a clear
GradflowError within GRADFLOW_TIMEOUT (it used to block for ever in
MPI_Comm_dup), and the process must then exit (no MPI_Finalize: it would
wait for the missing rank)."""
import sys
import time

from mpi4py import MPI

import gradflow as gf

R, N = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
if R == N - 1:
    sys.exit(0)
t0 = time.monotonic()
try:
    gf.init()
except gf.GradflowError as e:
    took = time.monotonic() - t0
    assert "init()" in str(e) and "timed out" in str(e), e
    assert took < 30, f"init() raised only after {took:.0f} s"
    print(f"rank {R} init raised after {took:.1f} s: {e}", flush=True)
    sys.exit(5)
print(f"rank {R}: init() returned without the last rank", flush=True)
