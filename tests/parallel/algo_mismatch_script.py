"""Ranks started with different settings that change the protocol (argv:
`KEY=v0,v1,...` per setting, one value per rank, cycled; a bare value list
means GRADFLOW_ALLREDUCE_ALGO) would run different protocols on the same
message: init() must refuse on every rank, with a clear GradflowError that
names every setting that differs and the ranks on each side."""
import os
import sys

from mpi4py import MPI

import gradflow as gf

R, N = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
settings, differing = {}, []
for arg in sys.argv[1:]:
    key, values = arg.split("=", 1) if "=" in arg else ("GRADFLOW_ALLREDUCE_ALGO", arg)
    values = values.split(",")
    os.environ[key] = settings[key] = values[R % len(values)]
    if len({values[r % len(values)] for r in range(N)}) > 1:
        differing.append(key)
try:
    gf.init()
except gf.GradflowError as e:
    msg = str(e)
    assert "settings differ between ranks" in msg or "settings are invalid on some ranks" in msg, msg
    for key in differing:  # each named, with the ranks on each side (or the invalid rank)
        assert key in msg and " rank" in msg, (key, msg)
    print(f"rank {R} refused: {e}", flush=True)
else:
    raise AssertionError(f"rank {R}: init() accepted settings {settings}")
