"""Process-wide runtime control: init/shutdown, rank and size queries and
the submit helper every binding uses. The process's exit and excepthook
paths (an uncaught exception on one rank makes every rank's pending
collectives raise) are gradflow/_exit_hooks.py.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mpi4py

# The background thread calls MPI. Setting the level starts nothing: MPI is
# initialized when init() first imports mpi4py.MPI (_mpi()), so `import
# gradflow` alone never starts MPI (a program may import it and never run
# distributed, or set MPI up itself first).
mpi4py.rc.thread_level = "multiple"
if TYPE_CHECKING:  # annotations only; imported for real by _mpi()
    from mpi4py import MPI

from . import _native  # noqa: E402
from . import _handles  # noqa: E402
from . import monitor as _monitor  # noqa: E402
from . import process_sets as _process_sets  # noqa: E402
from . import settings_check as _settings_check  # noqa: E402
from . import _withdrawal  # noqa: E402
from ._handles import Handle  # noqa: E402
from .runner import notice as _notice  # noqa: E402
from .elastic import worker as _elastic  # noqa: E402
from . import _exit_hooks  # noqa: E402
from ._exit_hooks import on_peer_failure_notice  # noqa: E402,F401 - gradflow/__init__.py's

GradflowError = _native.GradflowError

# Collective kinds: enum class OpKind in native/common.h.
ALLREDUCE, ALLGATHER, BROADCAST, REDUCESCATTER, ALLTOALL, BARRIER, JOIN = range(7)
_KIND_NAMES = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "barrier", "join"]

_lock = threading.Lock()
_counters: Dict[str, int] = {}  # kind name -> next auto-name number
_hooks_installed = False
_comm: Optional[MPI.Comm] = None
_generation = 0  # successful init() calls (see generation())


def _mpi():
    """mpi4py.MPI; the first call initializes MPI (at THREAD_MULTIPLE).
    MPI's start-up waits for every rank of the job, holding the GIL, and
    gradflow's bounded waits start only after it: a native watchdog ends
    the process with a message if it takes longer than GRADFLOW_INIT_TIMEOUT (a
    rank that never calls init(); native/init_watchdog.h)."""
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI  # noqa: PLC0415
        return MPI
    _native.arm_init_watchdog()
    _notice.report_mpi_start("wait")  # gradflowrun watches for a rank that never comes
    try:
        from mpi4py import MPI  # noqa: PLC0415
    finally:
        _native.disarm_init_watchdog()
    _notice.report_mpi_start("up")
    return MPI


def init(comm: Optional[Union[MPI.Comm, Sequence[int]]] = None,
         process_sets: Optional[Sequence["_process_sets.ProcessSet"]] = None) -> None:
    """Start gradflow on `comm` (default: MPI.COMM_WORLD; any mpi4py
    intracommunicator, sub-communicators included; or, as in Horovod, a list
    of MPI.COMM_WORLD ranks, which must include this rank). Reads GRADFLOW_*
    settings and rejects invalid ones. `process_sets` (a list of ProcessSet,
    the same on every rank) are registered in order, as by add_process_set;
    Horovod's "dynamic" is accepted (sets can always be added later).
    Calling it again while initialized does nothing."""
    global _comm, _hooks_installed
    if _native.is_initialized():
        return
    # GRADFLOW_* variables only Python reads (GRADFLOW_TF_OVERLAP) are
    # rejected here, as the core rejects its own below, not first when a
    # TensorFlow step is traced (settings_check.py); before MPI starts.
    _settings_check.check_python_settings()
    MPI = _mpi()
    if isinstance(process_sets, str) and process_sets.lower() == "dynamic":
        process_sets = []
    process_sets = list(process_sets or [])
    for ps in process_sets:
        if not isinstance(ps, _process_sets.ProcessSet):
            raise ValueError(f"gradflow.init: process_sets must hold ProcessSet objects, "
                             f"got {ps!r}")
    elastic_link = None
    if comm is None and _elastic.enabled():
        # Elastic mode: each worker is an MPI job of its own; the driver
        # assigns this generation's ranks and the group connects (worker.py).
        elastic_link = _elastic.link()
        elastic_link.on_failure = _on_elastic_peer_failure
        comm = elastic_link.next_communicator()
        _native.clear_interrupt()  # a previous generation's dead-peer notice
    elif comm is None:
        comm = MPI.COMM_WORLD
        _check_slurm_world(comm.size, os.environ)
    elif not isinstance(comm, MPI.Comm):
        comm = _comm_of_ranks(comm)
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise ValueError(f"gradflow.init: comm must be an mpi4py communicator, got {comm!r}")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise GradflowError(
            "gradflow needs MPI initialized with MPI_THREAD_MULTIPLE; import gradflow before "
            "initializing MPI elsewhere, or initialize it with that level")
    if not _hooks_installed:  # before init: a timed-out init must skip MPI_Finalize too
        _exit_hooks.install(lambda: _comm)
        _hooks_installed = True
    from . import horovod_compat  # noqa: PLC0415 - reads HOROVOD_* only in compat mode
    mapped = horovod_compat.before_init()
    if elastic_link is None:  # (an elastic generation's world is not COMM_WORLD)
        _exit_hooks.init_waits_for(comm, MPI)
    try:
        _native.init(int(comm.handle),
                     _timeline_override(elastic_link.gen if elastic_link is not None else None))
    except Exception as e:
        horovod_compat.reraise_with_origin(e, mapped)
        raise
    _comm = comm
    _notice.report_mpi_start("ready")
    global _generation
    _generation += 1
    horovod_compat.after_init(_native.rank())
    with _lock:
        _counters.clear()
    _process_sets._after_init()
    for ps in process_sets:
        _process_sets.add_process_set(ps)
    # Under gradflowrun --monitor only: the launcher numbers ranks in COMM_WORLD.
    _monitor.start_if_asked(MPI.COMM_WORLD.Get_rank())


def _timeline_override(elastic_generation: Optional[int]) -> Dict[str, str]:
    """Note [One timeline file per runtime]: rank 0 of each runtime opens
    GRADFLOW_TIMELINE for writing, which truncates it. After shutdown() and
    init() again, or an elastic reset, the new runtime wiped the old one's
    events, the failure an elastic timeline is read for included. So only
    the first runtime writes the path itself: the elastic generation g >= 1
    writes ``<path>.gen<g>`` (the driver's number, the same on every rank,
    whichever process is rank 0), and this process's k-th init() (k >= 2)
    outside elastic mode ``<path>.init<k>``."""
    path = os.environ.get("GRADFLOW_TIMELINE", "")
    if not path:
        return {}
    if elastic_generation is not None:
        return {"GRADFLOW_TIMELINE": f"{path}.gen{elastic_generation}"} \
            if elastic_generation > 0 else {}
    return {"GRADFLOW_TIMELINE": f"{path}.init{_generation + 1}"} if _generation > 0 else {}


def generation() -> int:
    """How many times init() has succeeded in this process: objects bound to
    a runtime (a DistributedOptimizer's pools) compare it to know they must
    re-bind after an elastic reset."""
    return _generation


def _on_elastic_peer_failure(message: str) -> None:
    """The elastic driver says a peer of this generation died: fail this
    generation's waits (they raise HorovodInternalError; the elastic run loop
    rolls back and re-forms). Unlike gradflowrun's fail-fast notice it does
    not doom the process."""
    _native.interrupt_waits(message)


def _check_slurm_world(world_size: int, environ) -> None:
    """Raise when srun started several tasks but MPI gave each a world of its
    own: srun without a PMI plugin (``--mpi=none``, Slurm's default
    MpiDefault) starts every task as an MPI singleton, which would otherwise
    train alone without any error."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if world_size != 1 or not tasks.isdigit() or int(tasks) < 2:
        return
    if any(environ.get(v) for v in ("PMI_FD", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")):
        return  # a launcher did give MPI a world: size 1 is what it asked for
    raise GradflowError(
        f"gradflow.init: srun started {tasks} tasks but MPI sees a world of 1 on each: srun "
        "gave MPI no PMI server (its --mpi plugin is none); run `srun --mpi=pmi2 ...`, set "
        "SLURM_MPI_TYPE=pmi2, or start the job with gradflowrun, which does so")


def _comm_of_ranks(ranks) -> MPI.Comm:
    """init(comm=[ranks]): a communicator of those MPI.COMM_WORLD ranks
    (only they call this: MPI_Comm_create_group)."""
    try:
        ranks = sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        raise ValueError(f"gradflow.init: comm must be an mpi4py communicator or a list of "
                         f"ranks, got {ranks!r}") from None
    world = _mpi().COMM_WORLD
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= world.size:
        raise ValueError(f"gradflow.init: comm={ranks} must list distinct ranks of "
                         f"MPI.COMM_WORLD (size {world.size})")
    if world.rank not in ranks:
        raise ValueError(f"gradflow.init: this rank ({world.rank}) is not in comm={ranks}; only "
                         "the listed ranks may call init(comm=...)")
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def shutdown() -> None:
    """Stop the background thread. Pending collectives raise on every rank,
    including those other threads are waiting on (safe from any thread)."""
    _native.shutdown()
    _handles.forget_all()


def is_initialized() -> bool:
    """Whether init() has been called (and shutdown() has not)."""
    return _native.is_initialized()


def rank() -> int:
    """This process's rank in the gradflow communicator."""
    return _native.rank()


def size() -> int:
    """Number of ranks."""
    return _native.size()


def local_rank() -> int:
    """Rank among the processes on this node."""
    return _native.local_rank()


def local_size() -> int:
    """Number of processes on this node."""
    return _native.local_size()


def cross_rank() -> int:
    """Index of this node among the nodes (ranks with the same local_rank)."""
    return _native.cross_rank()


def cross_size() -> int:
    """Number of nodes."""
    return _native.cross_size()


def mpi_comm() -> MPI.Comm:
    """The mpi4py communicator gradflow was initialized with."""
    if _comm is None or not is_initialized():
        # The type and words every other call before init() raises (native).
        raise _native.GradflowValueError(
            "gradflow has not been initialized: call gradflow.init() (or hvd.init()) first")
    return _comm


def stats(process_set: Any = None) -> Dict[str, float]:
    """Counters since start or the last reset_stats(): bytes_sent, bytes_received,
    allreduce.count[.algo.wire], seconds_negotiation / seconds_codec /
    seconds_transfer, seconds_sparse (CPU time of CSC's passes over the
    buffer: absorb, select, pack, unpack), fusion.bytes_copied,
    sparse.chunks_sent, sparse.buckets_sent_dense_by_policy (CSC buckets the
    auto sparse policy sent dense), allreduce.bytes_input (bytes submitted to allreduce,
    before CSC and the 16-bit wire), wire_overflow (collectives whose 16-bit
    wire overflowed), pool.collectives / pool.buckets (gradient-pool
    collectives and the buckets they carried), pool.merged_collectives /
    pool.merged_buckets (those that carried several adjacent buckets,
    GRADFLOW_POOL_MERGE), negotiation.cycles (coordination exchanges, idle
    ones included: GRADFLOW_IDLE_CYCLE_MAX), stall_warnings (rank 0), ... gradflow.stats_scalars
    turns them into per-step TensorBoard scalars. Each process set's engine counts its own
    collectives: `process_set=` selects which (default: the global set)."""
    return dict(_native.stats(_process_sets.process_set_id(process_set, "stats")))


def reset_stats(process_set: Any = None) -> None:
    """Zero every counter (of the global set, or of `process_set`)."""
    _native.reset_stats(_process_sets.process_set_id(process_set, "reset_stats"))


def timeline_mark(name: str) -> None:
    """Add an instant event (e.g. "step 12") to the GRADFLOW_TIMELINE trace, if enabled."""
    _native.timeline_mark(str(name))


def auto_name(kind: int, name: Optional[str], process_set: Any = None) -> str:
    """The given name, or `<kind>.noname.<n>` counting per kind (as Horovod
    does); ranks that issue unnamed collectives in the same order agree. A
    process set counts on its own (`<kind>.set<id>.noname.<n>`): a member's
    unnamed collectives in a set must not shift its global names."""
    ps = _process_sets.process_set_id(process_set, _KIND_NAMES[kind])
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"gradflow: name must be a non-empty string, got {name!r}")
        return name
    key = _KIND_NAMES[kind] if ps == 0 else f"{_KIND_NAMES[kind]}.set{ps}"
    with _lock:
        n = _counters.get(key, 0)
        _counters[key] = n + 1
        return f"{key}.noname.{n}"


def auto_name_counts() -> List[int]:
    """Next auto-name number of every kind, in kind order (join() sends them)."""
    with _lock:
        return [_counters.get(k, 0) for k in _KIND_NAMES]


def advance_auto_names(counts: Sequence[int]) -> None:
    """Move every kind's auto-name counter up to `counts` (the maximum over
    ranks, agreed by join()): a rank that skipped unnamed collectives while
    joined, or had one refused, names the next ones as the other ranks do."""
    with _lock:
        for key, n in zip(_KIND_NAMES, counts):
            _counters[key] = max(_counters.get(key, 0), int(n))


class _Group:
    """A grouped op being submitted: its length, and its members' native
    submit() arguments with their handles, held until the group is complete."""

    def __init__(self, size: int):
        self.size = size
        self.members: List[Tuple[tuple, Handle]] = []


# The grouped op being submitted on this thread (None: none); read by submit().
_group: contextvars.ContextVar[Optional[_Group]] = contextvars.ContextVar("gradflow_group",
                                                                          default=None)


def in_group() -> bool:
    """A grouped op is being submitted on this thread (submitting_group)."""
    return _group.get() is not None


@contextlib.contextmanager
def submitting_group(size: int, names: Sequence[str], kind: int, process_set: Any):
    """Collectives submitted inside are the `size` members of one grouped op,
    named `names` (`<base>.<i>`); `size` 0: not a group, submitted at once.
    If the block fails, every name that did not reach the core (of `kind`,
    on `process_set` as the caller passed it) is withdrawn: every rank fails
    it (native Note [Withdrawn names]); `size` 0 too.

    All or nothing: the members reach the core only when the block ends,
    after the core checked every one of them, so a member that fails on
    this rank (a user Compressor raising, an unsupported dtype) leaves none
    of the others in flight. Before, the members before it had been
    submitted: the other ranks reduced them with this rank's next call, or
    waited for GRADFLOW_TIMEOUT. And each member carries `size`, so ranks
    that pass lists of different lengths fail at once (native Note [Grouped
    lists]) instead of reducing the common ones and stalling on the rest."""
    if size <= 0:
        with _withdrawal.reaching_core(names, kind, process_set):
            yield
        return
    group = _Group(int(size))
    token = _group.set(group)
    try:
        yield
    except BaseException as exc:
        for _, handle in group.members:
            handle.never_submitted()
        _withdraw_group(group, names, kind, process_set, exc)
        raise
    finally:
        _group.reset(token)
    try:
        for args, _ in group.members:
            _native.check(*args)
        for args, handle in group.members:
            handle.submitted(_native.submit(*args))
    except BaseException as exc:
        # (A submit can still fail: a name another call has in flight.)
        for _, handle in group.members:
            if handle.native is None:
                handle.never_submitted()
        _withdraw_group(group, names, kind, process_set, exc)
        raise


def _withdraw_group(group: _Group, names: Sequence[str], kind: int, process_set: Any,
                    exc: BaseException) -> None:
    """Withdraws a failed group's members that never reached the core."""
    reached = {handle.name for _, handle in group.members if handle.native is not None}
    _withdrawal.withdraw_all(kind, [n for n in names if n not in reached], process_set, exc,
                             group.size)


def submit(kind: int, name: str, in_ptr: int, out_ptr: int, dtype: int, shape: Sequence[int],
           keep_alive: tuple, finish: Optional[Callable[[dict], Any]] = None, *, op: int = 0,
           root: int = 0, wire: int = -1, prescale: float = 1.0, postscale: float = 1.0,
           splits: Sequence[int] = (), sparse_ratio: float = -1.0,
           process_set: Any = None, step_tag: str = "",
           rollback_residual: bool = False) -> Handle:
    """Queue one collective on raw buffers; `keep_alive` holds them until done.
    `process_set` is what the caller passed as `process_set=` (None: all
    ranks); this is where every binding's value is translated. `step_tag`
    (allreduce): the step this collective belongs to, which every rank must
    give alike (native Note [Step tags]). `rollback_residual` (a named
    sparse allreduce): its residual first goes back to before its last step,
    which the optimizer skipped (Note [A skipped step owes its chunks])."""
    if "\x00" in name:  # C strings would cut it short in every error message
        raise ValueError(f"gradflow: collective name {name!r} contains a NUL character")
    if not name.isascii():  # (O(1) for str) a lone surrogate has no UTF-8 form: the
        try:                # core's call raised pybind11's 'incompatible function arguments'
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"gradflow: collective name {name!r} is not valid Unicode text "
                             "(a lone surrogate, e.g. from os.fsdecode of undecodable bytes); "
                             "it cannot be sent as UTF-8") from None
    ps = _process_sets.process_set_id(process_set, _KIND_NAMES[kind])
    _handles.sweep()
    group = _group.get()
    args = (kind, name, in_ptr, out_ptr, dtype, [int(d) for d in shape], op, root, wire,
            float(prescale), float(postscale), [int(s) for s in splits], float(sparse_ratio), ps,
            step_tag, bool(rollback_residual), group.size if group else 0)
    if group is None:
        try:
            native = _native.submit(*args)
        except BaseException as exc:  # refused here: the other ranks must not wait for it
            _withdrawal.withdraw(kind, name, ps, exc)
            _withdrawal.mark_submitted(name)  # answered for: `preparing` must not withdraw again
            raise
        _withdrawal.mark_submitted(name)
        return Handle(native, keep_alive, finish, name, ps)
    handle = Handle(None, keep_alive, finish, name, ps)  # submitted when the group is complete
    group.members.append((args, handle))
    _withdrawal.mark_submitted(name)  # the group answers for it now
    return handle
