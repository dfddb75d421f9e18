"""Elastic numpy job for test_elastic_finish.py (gradflowrun --min-np): the
workers allreduce for 40 steps, committing each, except rank 1, which
returns from the elastic function after 5: its program ends in order while
the others still reduce, so their next allreduce raises "shutdown() was
called on some rank". gradflowrun must not report that as a successful job."""
import time

import numpy as np

import gradflow as gf
from gradflow.elastic import ObjectState, run

gf.init()
state = ObjectState(step=0)


@run
def train(state):
    while state.step < 40:
        if gf.rank() == 1 and state.step == 5:
            return "ended early"
        gf.allreduce(np.ones(2), name="x")
        state.step += 1
        state.commit()
        time.sleep(0.02)
    return "trained"


print(f"rank {gf.rank()}: {train(state)}", flush=True)
