"""Note [Abandoned operations] (native/mpi_internal.h), run by
test_process_sets.py on 3 ranks: rank 0's engine of the set {0, 2} gives up
(interrupt_waits) on a negotiation allreduce that rank 2's idle engine of
that set has not joined yet; rank 2's engine joins it at its next idle cycle,
and rank 0 keeps MPI progressing and allocating meanwhile. Before the fix MPI
completed the abandoned request into freed memory: rank 0 aborted with heap
corruption in about 1 run in 3. Prints "abandoned OK" from rank 0."""
import os
import time

import numpy as np
from mpi4py import MPI

import gradflow as gf
from gradflow import _native

gf.init()
R = gf.rank()
pair = gf.add_process_set([0, 2])
if R in (0, 2):
    gf.allreduce(np.ones(4), name="warm", process_set=pair)
gf.barrier()
if R == 0:
    # Rank 2 never submits this: rank 0's pair engine cycles every 100 us and
    # waits in its bit-vector allreduce for rank 2's idle engine (up to 20 ms).
    h = gf.allreduce_async(np.ones(4), name="never", process_set=pair)
    time.sleep(0.5)
    _native.interrupt_waits("the test gives up")
    try:
        h.wait()
        raise AssertionError("the interrupted wait returned")
    except gf.GradflowError as e:
        assert "the test gives up" in str(e), e
    keep = []
    t = time.time()
    while time.time() - t < 2:  # MPI progress (completes the late join) and allocations
        MPI.COMM_WORLD.Iprobe()
        keep = (keep + [[bytes(24) for _ in range(50)]])[-50:]
    print("abandoned OK", flush=True)
else:
    time.sleep(3)
# The runtimes are broken on purpose: leave without MPI_Finalize.
os._exit(0)
