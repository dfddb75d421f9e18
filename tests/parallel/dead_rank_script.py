"""Rank 1 vanishes (os._exit(argv[1])) after one allreduce, or with argv[1]
"end" ends its program in order (sys.exit(0): gradflow shuts down at exit,
then MPI_Finalize waits for the others); the others must raise. Prints "rank R raised after T s: ..."; the test checks T."""
import os
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R = gf.rank()
gf.allreduce(np.ones(4), name="first")
if R == 1:
    time.sleep(0.3)  # the others are waiting in negotiation by now
    if sys.argv[1] == "end":
        sys.exit(0)
    os._exit(int(sys.argv[1]))
t0 = time.time()
try:
    gf.allreduce(np.ones(4), name="second")
except gf.GradflowError as e:
    print(f"rank {R} raised after {time.time() - t0:.2f} s: {e}", flush=True)
    sys.exit(7)
print(f"rank {R}: no error", flush=True)
