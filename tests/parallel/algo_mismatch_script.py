"""Ranks started with different GRADFLOW_ALLREDUCE_ALGO (argv: one algorithm
per rank, comma-separated) would run different protocols on the same
message: init() must refuse on every rank, with a clear GradflowError."""
import os
import sys

from mpi4py import MPI

import gradflow as gf

algos = sys.argv[1].split(",")
R = MPI.COMM_WORLD.rank
os.environ["GRADFLOW_ALLREDUCE_ALGO"] = algos[R % len(algos)]
try:
    gf.init()
except gf.GradflowError as e:
    assert "settings differ between ranks" in str(e), str(e)
    print(f"rank {R} refused: {e}", flush=True)
else:
    raise AssertionError(f"rank {R}: init() accepted algorithms {algos}")
