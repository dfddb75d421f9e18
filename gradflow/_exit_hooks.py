"""The process's fail-fast hooks, installed by the first init(): an
uncaught exception tells every rank before this one dies (so they raise
instead of waiting), gradflowrun's dead-peer notice fails every wait, and
the exit path stops the runtime and skips MPI_Finalize when a peer is dead
or the peers were told to give up (it would wait for them forever)."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import _native
from .elastic import worker as _elastic
from .runner import notice as _notice

GradflowError = _native.GradflowError
_uncaught_exception = False
# The uncaught exception was the program's own, raised while nothing had
# failed (not a peer's failure surfacing here): the exit message says so.
_own_failure = False
_comm_of: Callable[[], Any] = lambda: None  # the runtime's communicator (install())


def install(comm_of: Callable[[], Any]) -> None:
    """Install the excepthook and the exit hook (once per process, before
    MPI is up: a timed-out init() must skip MPI_Finalize too). `comm_of`
    returns the runtime's mpi4py communicator or None (for the exit message)."""
    global _comm_of, _init_called
    _comm_of = comm_of
    _init_called = True
    _install_hooks()


# Note [A rank that leaves with MPI up and no init()]
# A program that starts MPI itself (imports mpi4py.MPI) and ends on some rank
# without calling init() (a branch that returns early) does not exit there:
# mpi4py's MPI_Finalize, run after every Python atexit handler (Py_AtExit),
# waits for the other ranks, while they wait in init() for it until
# GRADFLOW_TIMEOUT. Under gradflowrun, this rank says so on its way out
# (notice.MPI_START_ENV's <path>.left) and the others say whom their init()
# waits for (<path>.init, init_waits_for), so gradflowrun stops the job within
# seconds (supervise.py). Needs gradflow imported on the leaving rank; a
# process that never imports it, or ends with os._exit, still leaves the
# others to GRADFLOW_TIMEOUT, as does a plain mpiexec (there is no one to
# tell: the ranks' MPI cannot be interrupted, and aborting the job from this
# rank would also end jobs where it was never in init()'s communicator).
_init_called = False


def _leaving_without_init() -> None:
    if _init_called or _native.forked_child():
        return
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            _notice.report_mpi_start("left")
    except Exception:
        pass


if os.environ.get(_notice.MPI_START_ENV):
    atexit.register(_leaving_without_init)


def init_waits_for(comm: Any, mpi: Any) -> None:
    """Under gradflowrun: record the COMM_WORLD ranks of `comm`, whose init()
    this rank is about to wait for (Note [A rank that leaves with MPI up and
    no init()]). Never raises."""
    if not os.environ.get(_notice.MPI_START_ENV):
        return
    try:
        world = mpi.COMM_WORLD.Get_group()
        ranks = mpi.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())), world)
        _notice.report_init_wait([r for r in ranks if r != mpi.UNDEFINED])
    except Exception:
        pass


def _write_whole_traceback(exc_type, exc, tb) -> bool:
    """Print what the default excepthook prints, in one write. Under
    PYTHONUNBUFFERED (gradflowrun sets it; many job scripts do) the default
    hook writes each piece of a line separately, and the peers' messages
    about this very failure, arriving at the same moment through mpiexec,
    landed inside its last line ("ValueError[gradflow rank 0] ...: boom").
    False if it could not, so the default hook runs instead."""
    try:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(text)
        sys.stderr.flush()
        return True
    except Exception:
        return False


def _install_hooks() -> None:
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        # Tell the other ranks before this one dies, so they raise instead of waiting.
        global _uncaught_exception, _own_failure
        try:
            if _native.forked_child():
                _uncaught_exception = True  # only the exit status (see _at_exit)
            elif _native.is_initialized():
                if isinstance(exc, GradflowError) and (_native.failed_fatally() or
                                                       getattr(exc, "job_wide", False)):
                    # Raised because a peer failed or died first (say so to
                    # gradflowrun, which then names that peer first), or an
                    # error every rank got alike (a mismatch, a bounded wait:
                    # gradflowrun then blames no rank).
                    _notice.report_peer_failure()
                elif not (isinstance(exc, GradflowError) or _native.failed_fatally() or
                          _peer_dead_notice.is_set()):
                    # The program's own exception, raised while nothing had
                    # failed (not, say, Keras wrapping a peer's failure):
                    # this rank failed first, whatever notice reaches it
                    # while it exits (a busy machine may schedule its exit
                    # after its peers').
                    _notice.report_own_failure()
                    _own_failure = True
                _native.abort(f"{exc_type.__name__}: {exc}")
                _uncaught_exception = True
        except Exception:
            pass
        if previous is sys.__excepthook__ and _write_whole_traceback(exc_type, exc, tb):
            return
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    # Registered after mpi4py's own atexit handler, so it runs first: the
    # background thread stops before MPI is finalized.
    atexit.register(_at_exit)


# Set when gradflowrun reports a dead peer (runner/notice.py): MPI_Finalize
# would then wait for that peer forever, whatever this rank's engines saw.
_peer_dead_notice = threading.Event()


def on_peer_failure_notice(message: str) -> None:
    """gradflowrun says a peer died: fail every pending and later wait, and
    remember it for the exit path (no MPI_Finalize)."""
    _peer_dead_notice.set()
    _native.interrupt_waits(message)


def _at_exit() -> None:
    if _native.forked_child():
        # A fork() child of an initialized process: MPI_Finalize here (mpi4py
        # runs it after this) would tear down the parent's MPI state through
        # the inherited connections and hang the job. Leave without it; the
        # status is 1 after an uncaught exception, else 0 (sys.exit's code
        # is not visible here; exit a child with os._exit to choose it).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if _uncaught_exception else 0)
    failed = _native.failed_fatally()
    link = _elastic.current()
    if link is not None and not (failed or _uncaught_exception or _peer_dead_notice.is_set()):
        link.finished()  # before the shutdown the others will see (worker.py)
    # Its last cycle carries this rank's abort message, if any; it may also be
    # where a dead peer shows (that cycle's deadline): True then.
    failed = _native.shutdown() or failed
    # A notice that arrived while shutdown() waited (it interrupts the wait):
    # e.g. this rank's own error came from a peer's orderly shutdown in a
    # process set before the launcher's word that another peer had died.
    failed = failed or _peer_dead_notice.is_set()
    # Threads woken in wait() (with an error) must take the GIL back before the
    # interpreter finalizes: one killed there would abort the process.
    deadline = time.monotonic() + 5
    while _native.threads_waiting() and time.monotonic() < deadline:
        time.sleep(0.002)
    if failed and not _uncaught_exception:
        _notice.report_peer_failure()  # the program caught the peer's failure and ended
    if failed or _uncaught_exception:
        # A peer is dead, or the peers were told to give up: MPI_Finalize
        # would wait for them forever.
        sys.stdout.flush()
        comm = _comm_of()
        # Say which: a plain user error (a TypeError before any collective)
        # was reported as a communication failure, and sent people looking
        # at the network (helper-20's audit, 2026-11-29).
        why = ("uncaught exception on this rank (the other ranks are told to stop)"
               if _own_failure else "communication failed or aborted")
        sys.stderr.write(f"[gradflow rank {comm.Get_rank() if comm else '?'}] {why}; "
                         "exiting with code 1 without MPI_Finalize\n")
        sys.stderr.flush()
        os._exit(1)
    # An orderly end: say so to gradflowrun before MPI_Finalize, which waits
    # for the other ranks (notice.FINISHED_ENV).
    _notice.report_finished()
    if _native.threads_left_inside_mpi():
        # A loop thread given up inside MPI (an elastic job re-formed after a
        # peer died in a window's creation, and finished): MPI_Finalize would
        # tear MPI down under it (SIGSEGV, measured). Leave without it, with
        # 0 as a fork() child does (sys.exit's code is not visible here).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
