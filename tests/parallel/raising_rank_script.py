"""Rank 1 raises an uncaught exception; the others' pending allreduce must
raise promptly with rank 1's message (not wait for the timeout). Prints
"rank R raised after T s: ..."; the test checks T and every exit code."""
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R = gf.rank()
gf.allreduce(np.ones(4), name="first")
if R == 1:
    time.sleep(0.5)
    raise ValueError("boom on rank 1")
t0 = time.time()
try:
    gf.allreduce(np.ones(4), name="second")
except gf.GradflowError as e:
    print(f"rank {R} raised after {time.time() - t0:.2f} s: {e}", flush=True)
    sys.exit(7)
print(f"rank {R}: no error", flush=True)
