"""Rank 1 vanishes (os._exit(argv[1])) after one allreduce; the others must
raise. Prints "rank R raised after T s: ..."; the test checks T."""
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
    os._exit(int(sys.argv[1]))
t0 = time.time()
try:
    gf.allreduce(np.ones(4), name="second")
except gf.GradflowError as e:
    print(f"rank {R} raised after {time.time() - t0:.2f} s: {e}", flush=True)
    sys.exit(7)
print(f"rank {R}: no error", flush=True)
