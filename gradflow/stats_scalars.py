# stats_scalars.py — turns gradflow.stats() counters into per-step monitoring
# scalars (bytes per step, effective compression, communication time vs wall
# time, stall warnings, wire overflow). Framework-free: the TensorBoard
# writers (gradflow.torch.StatsLogger, gradflow.keras.callbacks.
# TensorBoardStatsCallback) only decide when to call it and where to write.
"""Per-interval scalars from the differences of two ``gradflow.stats()`` snapshots.

Every value describes this process's own counters (the writers run on rank 0,
so they show rank 0's view). Scalars, all under ``prefix`` (``gradflow/``):

=============================  ===================================================
bytes_sent_per_step            wire bytes this rank sent in allreduces, per step
bytes_received_per_step        wire bytes this rank received, per step
allreduce_input_bytes_per_step bytes the framework asked to allreduce, per step
effective_compression          allreduce input bytes per wire byte sent (higher =
                               less traffic; a dense fp32 ring on N ranks sends
                               2(N-1)/N bytes per input byte; fp16 halves the
                               wire, CSC sends only the chosen chunks)
allreduces_per_step            collectives run per step (fused groups and buckets)
comm_seconds_per_step          core time in transfer + codec + sparse + negotiation
step_seconds                   wall time per step (between two logger calls)
comm_fraction                  comm_seconds_per_step / step_seconds: the share of
                               the step the core was communicating (it overlaps
                               backward, so it is not all waiting)
stall_warnings                 stall warnings so far (rank 0 raises them)
wire_overflow                  collectives whose 16-bit wire overflowed, this interval
sparse_fraction_sent           CSC chunks sent / chunks considered (CSC only)
pool_buckets_per_collective    gradient-pool buckets per pool collective (> 1: adjacent
                               buckets merged, GRADFLOW_POOL_MERGE; pool path only)
=============================  ===================================================
"""
from __future__ import annotations

import time
from typing import Dict, Optional

from . import _runtime

__all__ = ["StatsDelta"]

_COMM_SECONDS = ("seconds_transfer", "seconds_codec", "seconds_sparse", "seconds_negotiation")


class StatsDelta:
    """Remembers the last snapshot of ``gradflow.stats()`` and the time it
    was taken; :meth:`take` returns the scalars for the interval since then."""

    def __init__(self, prefix: str = "gradflow/") -> None:
        self.prefix = prefix
        self._last = _runtime.stats()
        self._last_time = time.perf_counter()

    def take(self, steps: int, now: Optional[Dict[str, float]] = None) -> Dict[str, float]:
        """Scalars for the `steps` training steps since the previous call.
        `now` (a stats() snapshot) is read here when not given."""
        if steps < 1:
            raise ValueError(f"gradflow: steps must be >= 1, got {steps}")
        now = _runtime.stats() if now is None else now
        t = time.perf_counter()
        d = {k: now.get(k, 0.0) - self._last.get(k, 0.0) for k in set(now) | set(self._last)}
        wall = t - self._last_time
        self._last, self._last_time = now, t
        comm = sum(d.get(k, 0.0) for k in _COMM_SECONDS)
        out = {
            "bytes_sent_per_step": d.get("bytes_sent", 0.0) / steps,
            "bytes_received_per_step": d.get("bytes_received", 0.0) / steps,
            "allreduce_input_bytes_per_step": d.get("allreduce.bytes_input", 0.0) / steps,
            "allreduces_per_step": d.get("allreduce.count", 0.0) / steps,
            "comm_seconds_per_step": comm / steps,
            "step_seconds": wall / steps,
            "comm_fraction": comm / wall if wall > 0 else 0.0,
            "stall_warnings": now.get("stall_warnings", 0.0),
            "wire_overflow": d.get("wire_overflow", 0.0),
        }
        if d.get("bytes_sent", 0.0) > 0:
            out["effective_compression"] = d.get("allreduce.bytes_input", 0.0) / d["bytes_sent"]
        if d.get("pool.collectives", 0.0) > 0:
            out["pool_buckets_per_collective"] = d.get("pool.buckets", 0.0) / d["pool.collectives"]
        if d.get("sparse.chunks_total", 0.0) > 0:
            sent = d.get("sparse.chunks_sent", 0.0)
            out["sparse_fraction_sent"] = sent / d["sparse.chunks_total"]
        return {self.prefix + k: float(v) for k, v in out.items()}
