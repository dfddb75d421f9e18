# gradflow/autotune_search.py — the autotune search itself (issue 16
# target 7): which setting to time next and which one wins. Pure Python,
# deterministic, no MPI: rank 0 runs it (gradflow/autotune.py feeds it the
# step times agreed over all ranks and broadcasts what it says).
"""Coordinate descent over a small grid of core settings, from measured
step times.

Order: `warmup_samples` samples of the starting setting are discarded
(Horovod's --autotune-warmup-samples); the starting setting is timed; then
each dimension in turn (allreduce algorithm, pool bucket size, ring piece
size, cycle time) tries its other values with the rest held at the best so
far, and keeps a value only if it beats the best time by more than
`min_gain`; the ring piece size is skipped unless the ring won. Last, a
confirmation: the starting setting and the winner are timed again,
alternately, and the final choice is whichever has the lower median over
all its samples, so noise in one sample cannot leave training on a setting
slower than the one it started with.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

# AllreduceAlgo codes of native/common.h (the tuning broadcast carries codes).
ALGO_CODES: Dict[str, int] = {"ring": 0, "two-sync": 1, "mpi": 2, "auto": 3, "recursive-doubling": 4,
                               "halving-doubling": 5}
ALGOS: Tuple[str, ...] = ("ring", "two-sync", "mpi")
BUCKET_MIB: Tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64)
# Ring pieces below the 1 MiB default are not tried. They were taken out when
# the two-rank ring deadlocked with 256 KiB pieces over libfabric tcp; that
# defect is fixed (Note [Receives before send waits], native/ring_allreduce.cc),
# but target 7's idle measurement used this range, so widening it waits for a
# new measurement (docs/performance.md "Autotune").
PIPELINE_KIB: Tuple[int, ...] = (1024, 2048, 4096)
CYCLE_MS: Tuple[float, ...] = (0.5, 1.0, 2.0, 5.0)
CONFIRM_ROUNDS = 2  # extra samples each of the start and the winner


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of the search: the core settings autotune may change."""
    allreduce_algo: str
    pool_bucket_bytes: int
    ring_pipeline_bytes: int
    cycle_time_ms: float

    def encode(self, final: bool) -> List[float]:
        """The tuning broadcast's values (native/tuning.h layout)."""
        return [float(ALGO_CODES[self.allreduce_algo]), float(self.ring_pipeline_bytes),
                float(self.cycle_time_ms), float(self.pool_bucket_bytes), 1.0 if final else 0.0]

    @staticmethod
    def decode(values: Sequence[float]) -> Tuple["Setting", bool]:
        names = {v: k for k, v in ALGO_CODES.items()}
        return (Setting(names[int(values[0])], int(values[3]), int(values[1]), float(values[2])),
                bool(values[4]))


@dataclasses.dataclass
class Sample:
    """One timed sample, as the log file shows it."""
    index: int
    phase: str  # warmup | search | confirm
    setting: Setting
    seconds: float  # median step time, the slowest rank's


def distinct_bucket_sizes(range_bytes: Sequence[Sequence[int]], candidates: Sequence[int],
                          start: int) -> List[int]:
    """Bucket sizes among `candidates` that cut the pools (each a list of
    range sizes in bytes, grad_pool.cc's rule) differently from `start`
    and from each other; the smallest size of each distinct cut is kept."""
    def cut(limit: int) -> Tuple[Tuple[int, ...], ...]:
        out = []
        for ranges in range_bytes:
            starts, so_far = [], 0
            for r, b in enumerate(ranges):
                if not starts or (so_far > 0 and so_far + b > limit):
                    starts.append(r)
                    so_far = 0
                so_far += b
            out.append(tuple(starts))
        return tuple(out)
    seen = {cut(start)}
    kept = []
    for c in sorted(candidates):
        key = cut(c)
        if key not in seen:
            seen.add(key)
            kept.append(c)
    return kept


class Search:
    """The autotune state machine. `current()` is the setting to time next
    (None when done); `report(seconds)` records its median step time."""

    def __init__(self, start: Setting, warmup_samples: int, bucket_sizes: Sequence[int],
                 tune_algo: bool = True, min_gain: float = 0.02):
        self.start, self.min_gain = start, min_gain
        self.samples: List[Sample] = []
        self.best: Setting = start
        self.best_seconds: Optional[float] = None
        self.final: Optional[Setting] = None
        algos = [start.allreduce_algo] + [a for a in ALGOS if a != start.allreduce_algo]
        # (dimension, values) in search order; each list starts with the
        # start's value, which is never re-timed inside its dimension.
        self._dims: List[Tuple[str, List]] = [
            ("allreduce_algo", algos if tune_algo else []),
            ("pool_bucket_bytes", list(bucket_sizes)),
            ("ring_pipeline_bytes", [k << 10 for k in PIPELINE_KIB]),
            ("cycle_time_ms", list(CYCLE_MS)),
        ]
        self._queue: List[Tuple[str, Setting]] = [("warmup", start)] * warmup_samples
        self._queue.append(("search", start))
        self._dim = 0
        self._confirming = False

    def done(self) -> bool:
        return self.final is not None

    def current(self) -> Optional[Setting]:
        return None if self.done() else self._queue[0][1]

    def phase(self) -> str:
        return "final" if self.done() else self._queue[0][0]

    def report(self, seconds: float) -> None:
        phase, setting = self._queue.pop(0)
        self.samples.append(Sample(len(self.samples), phase, setting, seconds))
        if phase == "search" and (self.best_seconds is None or
                                  seconds < self.best_seconds * (1.0 - self.min_gain)):
            self.best, self.best_seconds = setting, seconds
        if not self._queue:
            self._plan_next()

    def median_seconds(self, setting: Setting) -> float:
        """Median over every non-warm-up sample of `setting`."""
        times = [s.seconds for s in self.samples if s.setting == setting and s.phase != "warmup"]
        return statistics.median(times)

    def _plan_next(self) -> None:
        """Queue the next dimension's candidates, the confirmation, or finish."""
        while self._dim < len(self._dims):
            name, values = self._dims[self._dim]
            self._dim += 1
            if name == "ring_pipeline_bytes" and self.best.allreduce_algo != "ring":
                continue
            here = getattr(self.best, name)
            tries = [dataclasses.replace(self.best, **{name: v}) for v in values if v != here]
            if tries:
                self._queue = [("search", t) for t in tries]
                return
        if not self._confirming and self.best != self.start:
            self._confirming = True
            self._queue = [("confirm", s) for _ in range(CONFIRM_ROUNDS)
                           for s in (self.start, self.best)]
            return
        if self.best == self.start:
            self.final = self.start
        else:
            start_t, best_t = self.median_seconds(self.start), self.median_seconds(self.best)
            self.final = self.best if best_t < start_t else self.start
