# gradflow/autotune.py — runs the autotune search (GRADFLOW_AUTOTUNE,
# gradflowrun --autotune) at a binding's step boundaries: times steps, agrees
# on the score, broadcasts rank 0's decision, re-cuts the pools, writes the
# log. The search is gradflow/autotune_search.py; the core applies the
# broadcast decision in its agreed response order (native/tuning.h).
"""Autotune: tune the allreduce algorithm, pool bucket size, ring piece size
and cycle time during the first steps of training, from measured step times.

Protocol, per sample (1 settling step + GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE
timed steps, all at one setting): at the step boundary that ends it, every
rank allreduces (a Sum, one slot per rank) the median of its timed steps, so the score is the
slowest rank's and the same everywhere; rank 0 feeds it to the search and
broadcasts the next setting (``gradflow.autotune.<n>``, 5 float64s). The
core applies algorithm, ring piece size and cycle time right after running
that broadcast, at the same place in the agreed order on every rank; the
binding then re-cuts its pools' buckets to the broadcast bucket size before
its next step. Nothing on the wire is ever decided from a local clock alone.

Note [Autotune and join]: join() ends the search. The search needs every
rank to count the same steps; a rank that joins stops stepping, and a
broadcast cannot run while a rank is joined. So a rank that calls join()
stops its tuner at once, and the score allreduce (a Sum: slot i holds
member i's median, the last slot counts the members still training; a
joined rank contributes zeros to a Sum) tells the others: when the count
comes back short, the ranks still training stop too, without
broadcasting. (It used to be a Max with -1 from every training rank, read
as "someone joined" when a joined rank's 0 won; a joined rank now gives
min/max the op's identity, so only a Sum can count.) The settings applied so far stay;
they are the same on every rank because only broadcasts ever changed them.

Rank 0 writes one CSV line per sample and a final line to
GRADFLOW_AUTOTUNE_LOG (--autotune-log-file):
``sample,phase,allreduce_algo,pool_bucket_bytes,ring_pipeline_bytes,cycle_time_ms,median_step_seconds``
(phase: warmup | search | confirm | final; the final line's time is the
median of the chosen setting's samples; a search ended by join() writes a
last line with phase ``stopped-by-join``, the settings in force and an
empty time). One tuner per process: the first
DistributedOptimizer that steps owns it, agreed by every rank (Note [Agreed
tuner ownership]); a later one tunes once no earlier owner is alive. A tuner of a process set
(DistributedOptimizer(process_set=ps)) tunes that set's engine, and its
root writes `<GRADFLOW_AUTOTUNE_LOG>.set<id>` (log_path).
"""

from __future__ import annotations

import gc
import statistics
import time
import weakref
from typing import List, Optional, Sequence

import numpy as np

from . import _native
from . import autotune_search as _search
from .collectives import Max, Min, Sum, allreduce, broadcast
from .process_sets import ProcessSet, process_set_id, process_set_rank, process_set_size

LOG_HEADER = ("sample,phase,allreduce_algo,pool_bucket_bytes,ring_pipeline_bytes,"
              "cycle_time_ms,median_step_seconds")
SETTLE_STEPS = 1  # the first step of a sample (new bucket names negotiate) is not timed

_owner: Optional[object] = None  # the object whose steps drive the one tuner
_active: Optional["weakref.ReferenceType[Autotuner]"] = None  # the tuner, while searching


def log_path(path: str, process_set: Optional[ProcessSet]) -> str:
    """Where a tuner of `process_set` writes GRADFLOW_AUTOTUNE_LOG: the path
    itself for all ranks, `<path>.set<id>` for a process set's tuner, so the
    roots of two sets (one tuner each) never write one file."""
    ps = process_set_id(process_set, "autotune")
    return f"{path}.set{ps}" if path and ps != 0 else path


class Autotuner:
    """Drives the search at step boundaries of one optimizer; construct on
    every rank of `process_set` at the same step (collective: checks the log
    file on rank 0 and agrees whether it could be opened)."""

    def __init__(self, pools: Sequence[int], pool_range_bytes: Sequence[Sequence[int]],
                 pool_bucket_bytes: int, can_rebucket: bool,
                 process_set: Optional[ProcessSet] = None):
        cfg = _native.config()
        self.pools, self.process_set = list(pools), process_set
        self.steps_per_sample = int(cfg["autotune_steps_per_sample"])
        self.root = (process_set.ranks[0] if process_set is not None and process_set.ranks
                     else 0)
        self.is_root = process_set_rank(process_set, "autotune") == 0
        start = _search.Setting(cfg["allreduce_algo"], int(pool_bucket_bytes),
                                int(cfg["ring_pipeline_bytes"]), float(cfg["cycle_time_ms"]))
        buckets = _search.distinct_bucket_sizes(
            pool_range_bytes, [int(m * (1 << 20)) for m in _search.BUCKET_MIB],
            start.pool_bucket_bytes) if can_rebucket and self.pools else []
        self.search = _search.Search(start, int(cfg["autotune_warmup_samples"]), buckets)
        self.applied = start
        self.sample = 0
        self.times: List[float] = []
        self.last: Optional[float] = None
        self.log = None
        self._finished = False
        global _active
        _active = weakref.ref(self)
        failed = 0.0
        path = log_path(cfg["autotune_log"], process_set)
        if self.is_root and path:
            try:
                self.log = open(path, "w", encoding="utf-8")
                self.log.write(LOG_HEADER + "\n")
                self.log.flush()
            except OSError:
                failed = 1.0
        agreed = allreduce(np.array([failed]), op=Max, name="gradflow.autotune_log_check",
                           process_set=process_set)
        if agreed[0] > 0:
            raise ValueError(f"gradflow: GRADFLOW_AUTOTUNE_LOG (--autotune-log-file) "
                             f"{path!r} cannot be written on rank {self.root}")

    def done(self) -> bool:
        """True once the final setting is applied (on every rank at the same step)."""
        return self._finished

    def step_end(self) -> None:
        """Call at every step boundary, with nothing of this optimizer in flight."""
        if self._finished:
            return
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now
        if len(self.times) < SETTLE_STEPS + self.steps_per_sample:
            return
        median = statistics.median(self.times[SETTLE_STEPS:])
        self.times = []
        # Every member's median in its own slot, and a count of the members
        # still training: a joined rank's zeros leave the count short (Note
        # [Autotune and join]). One element per slot is non-zero: the sum is
        # exact, the same bits on every rank.
        members = process_set_size(self.process_set, "autotune")
        mine = np.zeros(members + 1)
        mine[process_set_rank(self.process_set, "autotune")] = median
        mine[members] = 1.0
        agreed = allreduce(mine, op=Sum, name=f"gradflow.autotune_score.{self.sample}",
                           process_set=self.process_set)
        if agreed[members] < members:
            self.stop_for_join()
            return
        slowest = float(agreed[:members].max())  # the slowest rank's median
        values = np.zeros(5)
        if self.is_root:
            self.search.report(slowest)
            self._log(self.search.samples[-1])
            nxt = self.search.current() or self.search.final
            values = np.array(nxt.encode(self.search.done()), dtype=np.float64)
        values = broadcast(values, self.root, name=f"gradflow.autotune.{self.sample}",
                           process_set=self.process_set)
        self.sample += 1
        setting, final = _search.Setting.decode(values)
        if setting.pool_bucket_bytes != self.applied.pool_bucket_bytes:
            for pool in self.pools:
                _native.pool_rebucket(pool, setting.pool_bucket_bytes)
        self.applied = setting
        if final:
            self._finished = True
            if self.is_root:
                self._log_final()
        self.last = time.perf_counter()  # the tuning collectives are not a step

    def stop_for_join(self) -> None:
        """End the search where it stands (a rank has called join())."""
        if self._finished:
            return
        self._finished = True
        self._write_row(len(self.search.samples), "stopped-by-join", self.applied, "", last=True)

    def _log(self, s: "_search.Sample") -> None:
        self._write_row(s.index, s.phase, s.setting, f"{s.seconds:.6f}")

    def _log_final(self) -> None:
        x = self.search.final
        self._write_row(len(self.search.samples), "final", x,
                        f"{self.search.median_seconds(x):.6f}", last=True)

    def _write_row(self, index: int, phase: str, x: "_search.Setting", seconds: str,
                   last: bool = False) -> None:
        """One CSV line of LOG_HEADER's columns (rank 0 only); `last` closes the log."""
        if self.log is None:
            return
        self.log.write(f"{index},{phase},{x.allreduce_algo},{x.pool_bucket_bytes},"
                       f"{x.ring_pipeline_bytes},{x.cycle_time_ms:g},{seconds}\n")
        if last:
            self.log.close()
            self.log = None
        else:
            self.log.flush()


def stop_for_join() -> None:
    """Called by join() before it is submitted: this rank stops tuning."""
    tuner = _active() if _active is not None else None
    if tuner is not None:
        tuner.stop_for_join()


def enabled() -> bool:
    """GRADFLOW_AUTOTUNE is on (the runtime's configuration)."""
    return bool(_native.config()["autotune"])


def claim(owner: object, process_set: Optional[ProcessSet] = None) -> bool:
    """True if `owner` (an optimizer, at its first step boundary) drives the
    process's one tuner, agreed by every rank of `process_set`.

    Note [Agreed tuner ownership]: the tuner is free when no earlier owner is
    alive. Whether an optimizer the user dropped is already freed is local:
    one held in a reference cycle lives until this process's cyclic garbage
    collector runs, and that runs at different moments on different ranks.
    A purely local answer let a second optimizer own the tuner on one rank
    and not on another, and the tuners' collectives then stalled until
    GRADFLOW_TIMEOUT. So a rank that still sees an earlier owner collects
    garbage first, and the ranks agree (a Min over the set) that every one
    of them sees the tuner free; otherwise this owner does not tune,
    on every rank alike. Costs one small allreduce per optimizer, only with
    autotune on."""
    global _owner
    if _owner is not None and _owner() is owner:
        return True
    if _owner is not None and _owner() is not None:
        gc.collect()  # a dropped optimizer in a reference cycle: free it now
    free = _owner is None or _owner() is None  # weakref to a dead owner: free again
    agreed = allreduce(np.array([1 if free else 0], np.int32), name="gradflow.autotune_claim",
                       op=Min, process_set=process_set)
    if int(agreed[0]) == 1:
        _owner = weakref.ref(owner)
        return True
    return False
