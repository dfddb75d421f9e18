"""Errors every rank gets alike, left uncaught, for gradflowrun's report
(test_faults.py::test_an_agreed_error_blames_no_rank): argv[1] "shape"
(rank r allreduces r + 1 elements: the coordinator's mismatch error) or
"names" (each rank its own name: Note [Bounded waits] fails them all after
GRADFLOW_TIMEOUT). Each rank first checks one good allreduce against the
exact sum, so the runtime works before the bad call."""
import sys

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
assert (gf.allreduce(np.full(3, R + 1.0), op=gf.Sum, name="good") == N * (N + 1) / 2).all()
if sys.argv[1] == "shape":
    gf.allreduce(np.ones(R + 1), name="shape.differs")
else:
    gf.allreduce(np.ones(2), name=f"name.of.rank.{R}")
print(f"rank {R}: no error", flush=True)
