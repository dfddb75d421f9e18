"""A rank that never calls init() while MPI is not started yet (argv[1]
"exit0": it exits with code 0; "hang": it sleeps past the timeout; "late":
it calls init() 4 s late, which must work). The
others' init() blocks inside MPI's own start-up (MPI_Init waits for every
rank, holding the GIL), where gradflow's bounded waits do not reach: the
native watchdog (native/init_watchdog.h) must end them with a message
after GRADFLOW_INIT_TIMEOUT, where they used to wait for ever. Nothing imports
mpi4py.MPI before init() here (lifecycle_init_timeout_script.py covers the
later stage, MPI up and gradflow's communicator duplicate waiting).
Prints "rank R init returned" if init() ever returns on a survivor."""
import os
import sys
import time

import gradflow as gf

# MPI is not up: the launcher's environment says which rank this is.
R = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
N = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "0")))
assert R >= 0 and N > 1, (R, N)
if R == N - 1:
    if sys.argv[1] == "exit0":
        sys.exit(0)
    if sys.argv[1] == "hang":
        time.sleep(60)
        sys.exit(0)
    time.sleep(4)  # "late": a slow start, longer than GRADFLOW_TIMEOUT, within the init timeout
t0 = time.monotonic()
gf.init()
print(f"rank {R} init returned after {time.monotonic() - t0:.1f} s", flush=True)
gf.shutdown()
