"""An elastic job whose ranks call state.commit() at different steps (a
user error: commit() runs a collective, so it stalls until GRADFLOW_TIMEOUT
on every rank; test_elastic_finish.py). Rank 1 pauses 3 s before its error
reaches elastic.run, as a rank on a loaded host may: by then rank 0 has
exited and the driver has told rank 1 that a peer died (Note [A stall is no
lost peer], gradflow/elastic/run.py). With ELASTIC_MISMATCH=1 the
error is a shape mismatch instead (job-wide, decided by the coordinator at
once), with the same pause."""
import os
import time

import numpy as np

import gradflow as gf
from gradflow import elastic

gf.init()
state = elastic.ObjectState(step=0)


@elastic.run
def train(state):
    if os.environ.get("ELASTIC_MISMATCH") == "1":
        try:
            gf.allreduce(np.ones(4 + gf.rank()), name="mismatched")
        except gf.HorovodInternalError:
            if gf.rank() == 1:
                time.sleep(3)
            raise
    while state.step < 8:
        gf.allreduce(np.ones(4), name=f"g{state.step}")
        state.step += 1
        try:
            if (state.step == 4) if gf.rank() == 0 else (state.step % 2 == 0):
                state.commit()
        except gf.HorovodInternalError:
            if gf.rank() == 1:
                time.sleep(3)
            raise
    return state.step


rank = gf.rank()
try:
    train(state)
except gf.HorovodInternalError as e:
    print(f"rank {rank} raised: {e}", flush=True)
    raise
print(f"rank {rank} finished (unexpected)", flush=True)
