"""What the training workers (_trainbench.py for torch, _kerasbench.py for
Keras) share: timing a repetition as the slowest rank's, the NIC counter of
the emulated cluster, and the JSON record the drivers (_traindriver.py) read.
Framework-free: no torch or TensorFlow import here."""
from __future__ import annotations

import json
import os
import statistics
from typing import Dict, Optional, Sequence


def nic_tx_bytes() -> Optional[int]:
    """tx_bytes of the emulated host's NIC (GFCLUSTER_IFACE, set by
    benchmarks/cluster), None outside the emulated cluster."""
    iface = os.environ.get("GFCLUSTER_IFACE")
    if not iface:
        return None
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def write_json_atomic(path: str, obj) -> None:
    """Replace `path` with obj as JSON in one step: the driver may read the
    file of a worker that is killed mid-write (partial results survive)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def step_timing(comm=None):
    """(barrier, max_all) for the training workers' timed repetitions: over
    mpi4py communicator `comm`, or no-ops for one process (comm None). A
    repetition's time is the slowest rank's (max_all)."""
    if comm is None:
        return (lambda: None), (lambda v: v)
    from mpi4py import MPI
    return comm.Barrier, (lambda v: comm.allreduce(v, op=MPI.MAX))


def train_worker_record(a, ranks: int, batch: int, init_seconds: float) -> Dict[str, object]:
    """The head of a training worker's JSON record (_trainbench, _kerasbench):
    the run's settings; "results" fills per system, "current" names the
    system running (a driver reading a killed worker's file sees which)."""
    return {"model": a.model, "ranks": ranks, "batch_per_rank": batch, "threads": a.threads,
            "warmup": a.warmup, "steps": a.steps, "reps": a.reps, "init_seconds": init_seconds,
            "env": {k: v for k, v in os.environ.items() if k.startswith("GRADFLOW_")},
            "results": {}, "current": None}


def throughput_fields(rep_seconds: Sequence[float], ranks: int, batch: int, steps: int):
    """samples/s of every timed repetition (all ranks), their median and the
    median step time: a training worker's result fields."""
    sps = [ranks * batch * steps / t for t in rep_seconds]
    return {"samples_per_s": sps, "throughput": statistics.median(sps),
            "step_seconds_median": statistics.median(rep_seconds) / steps}
