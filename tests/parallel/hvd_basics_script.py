# hvd_basics_script.py — Horovod's basics on gradflow.torch: build/runtime
# queries with gradflow's true values, start_timeline/stop_timeline at run
# time (rank 0 writes; the file holds exactly the collectives run between
# start and stop), Horovod's exception types (ValueError before init() and
# for a name submitted twice, HorovodInternalError for failed collectives).
# Arg: a directory for the timeline files (shared by the ranks).
import json
import os
import sys

import numpy as np
import torch

import gradflow as gf
import gradflow.torch as hvd

OUT = sys.argv[1]


def raises(fn, exc, text, what):
    try:
        fn()
    except exc as e:
        assert text in str(e), f"{what}: message {e!r} lacks {text!r}"
        return e
    raise AssertionError(f"{what}: no {exc.__name__}")


# ---- before init(): Horovod raises ValueError
for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.mpi_threads_supported, hvd.stop_timeline,
           lambda: hvd.start_timeline(os.path.join(OUT, "early.json"))):
    raises(fn, ValueError, "not been initialized", f"{fn} before init")
raises(lambda: hvd.allreduce(torch.ones(2)), ValueError, "not been initialized", "allreduce")

hvd.init()
R, N = hvd.rank(), hvd.size()

# ---- build and runtime queries: what gradflow really is (MPI only, CPU only)
assert hvd.is_homogeneous() is True  # one host: every node (the one) has N ranks
assert hvd.mpi_threads_supported() is True and hvd.mpi_enabled() is True and hvd.mpi_built()
assert hvd.gloo_enabled() is False and hvd.gloo_built() is False
assert hvd.nccl_built() == 0 and not hvd.ddl_built() and not hvd.ccl_built()
assert not hvd.cuda_built() and not hvd.rocm_built() and not hvd.sycl_built()
assert hvd.is_homogeneous is gf.is_homogeneous  # one implementation, re-exported

# ---- exception types
assert issubclass(gf.GradflowError, hvd.HorovodInternalError)
assert issubclass(hvd.HorovodInternalError, RuntimeError)
e = hvd.HostsUpdatedInterrupt(skip_sync=True)
assert isinstance(e, RuntimeError) and e.skip_sync is True
# A name submitted twice before the first completes: ValueError (Horovod's
# INVALID_ARGUMENT), raised at submit on the rank that did it; the first
# handle still completes with the right sum. The first cannot complete before
# every rank submitted it, so the others submit only after rank 0 tried twice
# (at one rank it may complete at once: not staged there).
if N > 1:
    if R == 0:
        h = hvd.allreduce_async(torch.full((3,), float(R)), name="twice", op=hvd.Sum)
        err = raises(lambda: hvd.allreduce_async(torch.ones(3), name="twice"), ValueError,
                     "submitted twice", "duplicate name")
        assert isinstance(err, hvd.HorovodInternalError) and isinstance(err, gf.GradflowError)
    hvd.allreduce(torch.ones(1), name="twice.tried")
    if R != 0:
        h = hvd.allreduce_async(torch.full((3,), float(R)), name="twice", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((3,), float(sum(range(N)))))
# A collective that fails on every rank (shapes differ): HorovodInternalError.
try:
    hvd.allreduce(torch.ones(2 + R), name="mismatch")
except hvd.HorovodInternalError as e:
    assert "mismatched" in str(e), e
else:
    raise AssertionError("shape mismatch did not raise")

# ---- timeline at run time
first, second = os.path.join(OUT, "first.json"), os.path.join(OUT, "second.json")
hvd.allreduce(torch.ones(4), name="before.start")
hvd.start_timeline(first, mark_cycles=True)
want = hvd.allreduce(torch.arange(4.0) + R, name="inside.first", op=hvd.Sum)
assert torch.equal(want, torch.arange(4.0) * N + sum(range(N)))
hvd.broadcast(torch.ones(2), 0, name="inside.broadcast")
hvd.start_timeline(second)  # switches files, as Horovod does
hvd.allreduce(torch.ones(4), name="inside.second")
hvd.stop_timeline()
hvd.allreduce(torch.ones(4), name="after.stop")
hvd.stop_timeline()  # stopping again is a no-op
raises(lambda: hvd.start_timeline(""), ValueError, "must not be empty", "empty path")
hvd.barrier()


def rows(path):
    with open(path) as f:
        events = json.load(f)  # a closed, valid Chrome trace
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    return events, names


if R == 0:
    ev1, names1 = rows(first)
    assert {"inside.first", "inside.broadcast"} <= names1, names1
    assert not names1 & {"before.start", "inside.second", "after.stop"}, names1
    assert any(e.get("name") == "CYCLE_START" for e in ev1), "mark_cycles wrote no cycle"
    ev2, names2 = rows(second)
    assert "inside.second" in names2 and not names2 & {"inside.first", "after.stop"}, names2
    assert not any(e.get("name") == "CYCLE_START" for e in ev2), "mark_cycles leaked"
print(f"ok basics (size {N})", flush=True)
hvd.shutdown()
print(f"ok done (size {N})", flush=True)
