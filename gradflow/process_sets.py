"""Horovod-style process sets, framework-free: `ProcessSet`,
`global_process_set`, `add_process_set`, `remove_process_set`, and
`process_set_id(process_set, what)`, the one translation from what a caller
passes as `process_set=` to the core's set id (every binding goes through
`gradflow._runtime.submit`, which calls it).

A process set is a subset of the global ranks that runs collectives among
themselves; each set this rank belongs to has its own engine in the core
(Note [Process sets], native/process_sets.h), so collectives on different
sets run concurrently. Registration is collective over all ranks.
"""
from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Union

from . import _native


class ProcessSet:
    """A set of global ranks that run collectives together (Horovod's
    `ProcessSet`). Build it from a list of ranks, then register it on every
    rank with `add_process_set` (or `init(process_sets=[...])`); it then has
    a `process_set_id` and can be passed as `process_set=` to any collective
    or `DistributedOptimizer`. Ranks are kept sorted, as Horovod does."""

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]):
        self.process_set_id: Optional[int] = None
        self._runtime = 0  # the init() its id belongs to (_runtimes_started at add_process_set)
        self.mpi_comm = None
        if _is_mpi_comm(ranks_or_comm):
            raise NotImplementedError(
                "gradflow: ProcessSet(<MPI communicator>) is not implemented; build the process "
                "set from a list of global ranks, e.g. ProcessSet(list_of_ranks)")
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("gradflow: ProcessSet needs a list of process ranks, got "
                             f"{ranks_or_comm!r}") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError(f"gradflow: ProcessSet ranks must be ints, got {ranks!r}")
        self.ranks: Optional[List[int]] = sorted(ranks)

    def size(self) -> Optional[int]:
        """Number of ranks in the set, or None if it is not registered."""
        if self.process_set_id is None or _stale(self):
            return None
        return len(_registered_ranks(self.process_set_id))

    def rank(self) -> Optional[int]:
        """This process's rank within the set (its index in `ranks`), or None
        if the set is not registered; ValueError if this rank is not a member.
        Collectives still take *global* ranks (broadcast's root_rank), as in
        Horovod."""
        if self.process_set_id is None or _stale(self):
            return None
        ranks = _registered_ranks(self.process_set_id)
        me = _native.rank()
        if me not in ranks:
            raise ValueError(f"gradflow: rank {me} is not part of process set "
                             f"{self.process_set_id} (ranks {ranks})")
        return ranks.index(me)

    def included(self) -> Optional[bool]:
        """Whether this process is a member (None if the ranks are unknown)."""
        if self.ranks is None:
            return None
        return _native.rank() in self.ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        if self.process_set_id == 0 or other.process_set_id == 0:
            return self.process_set_id == other.process_set_id
        return self.process_set_id == other.process_set_id and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def _is_mpi_comm(obj: Any) -> bool:
    # Only an object of mpi4py's can be a communicator, and its module is then
    # loaded: never import mpi4py.MPI here (that would start MPI at `import
    # gradflow`, which builds global_process_set).
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI is not None and isinstance(obj, MPI.Comm)


#: All ranks (id 0). Its `ranks` are filled in by `init()`.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _registered_ranks(process_set_id: int) -> List[int]:
    table = _native.process_sets()
    if process_set_id not in table:
        raise ValueError(f"gradflow: process set {process_set_id} is not registered (never added, "
                         "or removed by remove_process_set)")
    return list(table[process_set_id])


# init() calls so far: a set's id is only valid in the runtime that gave it
# (after shutdown() and init() the ids are handed out again, to other sets).
_runtimes_started = 0


def _after_init() -> None:
    """Called by init(): the global set's ranks are now known."""
    global _runtimes_started
    _runtimes_started += 1
    global_process_set.ranks = list(range(_native.size()))


def _stale(process_set: "ProcessSet") -> bool:
    """Registered in a runtime that has since been shut down."""
    return process_set.process_set_id not in (None, 0) and \
        process_set._runtime != _runtimes_started


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Register a process set and return it (its `process_set_id` set).
    Collective: every rank must call it, in the same order of process-set
    changes, with the same ranks (non-members too); otherwise every rank
    raises ValueError saying what each rank passed. A set with the same ranks
    as an existing one (or as the global set) raises ValueError. Unlike
    Horovod, no HOROVOD_DYNAMIC_PROCESS_SETS setting is needed."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if _stale(process_set):  # from a runtime that was shut down: register it anew
        process_set._invalidate()
    if process_set.process_set_id is not None:
        raise ValueError(f"gradflow: add_process_set: {process_set} is already registered")
    process_set.process_set_id = int(_native.add_process_set(list(process_set.ranks)))
    process_set._runtime = _runtimes_started
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a registered process set (collective over all ranks, like
    `add_process_set`) and invalidate the object; its pending collectives
    fail. Returns False (doing nothing) for the global set or a set that is
    not registered, as Horovod does."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"gradflow: remove_process_set needs a ProcessSet, got {process_set!r}")
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    if _stale(process_set):  # its id is another set's now: nothing of it to remove
        process_set._invalidate()
        return False
    process_set._invalidate()
    return bool(_native.remove_process_set(int(process_set_id)))


def process_set_id(process_set: Any, what: str) -> int:
    """The core's id for `process_set=` (None or the global set: 0). ValueError
    naming `what` for a set that is not registered (never added, or removed)
    or anything that is not a ProcessSet. Membership is checked by the core
    (a non-member's submit raises ValueError naming the set)."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"gradflow: {what}: process_set must be a gradflow.ProcessSet (or "
                         f"None for all ranks), got {process_set!r}")
    if process_set.process_set_id is None:
        raise ValueError(f"gradflow: {what}: {process_set} is not registered; call "
                         "add_process_set (or pass it to init(process_sets=...)) on every rank "
                         "first (a removed set cannot be used)")
    if _stale(process_set):
        # Its id now belongs to whatever set the new runtime numbered so.
        raise ValueError(f"gradflow: {what}: {process_set} was registered before shutdown() "
                         "(or an elastic reset) and is not registered in this runtime; call "
                         "add_process_set(it) (or init(process_sets=[...])) on every rank again")
    return int(process_set.process_set_id)


def member_id(process_set: Any, what: str) -> int:
    """`process_set_id`, and ValueError naming `what` if this rank is not a
    member (for objects only members may build, e.g. a DistributedOptimizer)."""
    ps = process_set_id(process_set, what)
    if ps != 0 and _native.rank() not in _registered_ranks(ps):
        raise ValueError(f"gradflow: {what}: rank {_native.rank()} is not a member of "
                         f"{process_set}; only its members may use it")
    return ps


def process_set_rank(process_set: Any, what: str) -> int:
    """This rank's index in `process_set=` (its global rank for all ranks)."""
    ps = process_set_id(process_set, what)
    if ps == 0:
        return _native.rank()
    ranks = _registered_ranks(ps)
    if _native.rank() not in ranks:
        raise ValueError(f"gradflow: {what}: rank {_native.rank()} is not a member of "
                         f"process set {ps} (ranks {ranks})")
    return ranks.index(_native.rank())


def set_ranks(process_set: Any, what: str) -> List[int]:
    """The global ranks of `process_set=` in set order (None: all ranks)."""
    ps = process_set_id(process_set, what)
    return list(range(_native.size())) if ps == 0 else _registered_ranks(ps)


def process_set_size(process_set: Any, what: str) -> int:
    """Number of ranks of `process_set=` (None: all ranks)."""
    ps = process_set_id(process_set, what)
    return _native.size() if ps == 0 else len(_registered_ranks(ps))
