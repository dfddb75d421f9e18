"""Runs a few named collectives with GRADFLOW_TIMELINE set (checked by test_timeline.py)."""
import numpy as np

import gradflow as gf

gf.init()
R = gf.rank()
for step in range(3):
    hs = [gf.allreduce_async(np.ones(1000 * (k + 1), np.float32), name=f"grad.{k}") for k in range(4)]
    for h in hs:
        h.wait()
    gf.timeline_mark(f"step {step}")
gf.allgather(np.ones((R + 1, 2)), name="gathered")
gf.broadcast(np.ones(3), 0, name="bcast")
gf.shutdown()
