"""The failure-notice channel from gradflowrun's rank wrapper to the gradflow
runtime in the rank's process: a pipe the wrapper opens and the rank inherits.
When a peer dies (killed by a signal, or exited without finishing), the
wrapper writes one line saying so; the rank's watcher thread hands it to the
native runtime, whose pending and later waits then fail at once with that
message instead of waiting GRADFLOW_TIMEOUT. Standard library only: the
wrapper (run by path) and gradflow/__init__.py both import it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import stat
import sys
import threading
from typing import Callable, Dict, Optional, Tuple

# Set by rank_wrapper.py for the command it runs; not GRADFLOW_* so config.cc
# ignores them. The id (device:inode of the pipe) makes sure a process that
# inherited the variable but not the descriptor never reads someone else's fd.
FD_ENV = "GRADFLOWRUN_NOTICE_FD"
ID_ENV = "GRADFLOWRUN_NOTICE_ID"
_MAX_MESSAGE = 4096
# The other direction: a file the rank creates when it fails *because* a peer
# failed first (its collective raised after the runtime failed fatally), so
# gradflowrun blames the peer even when this rank's exit is seen first.
PEER_FAILURE_ENV = "GRADFLOWRUN_PEER_FAILURE_FILE"
# And the converse: a file the rank creates when an exception of its own
# (not a GradflowError) ends it, so a notice of a peer's exit that reaches it
# while it is still exiting does not make it count as "told" (it failed
# first; a busy machine may schedule its exit after the peers').
OWN_FAILURE_ENV = "GRADFLOWRUN_OWN_FAILURE_FILE"
# And a file the rank creates when its program ends gradflow in order (the
# exit's shutdown, nothing failed): a rank that ran out of work early (its
# last step, a sys.exit(0)) then waits in MPI_Finalize while the others'
# next collective fails with "shutdown() was called on rank R", and
# gradflowrun names it instead of only "stopped it after the failure"
# (before, the first rank to raise was named as if it had failed first).
FINISHED_ENV = "GRADFLOWRUN_FINISHED_FILE"
# And files around MPI's start-up in init() (<path>.wait before, <path>.up
# after): MPI_Init waits for every rank and cannot be interrupted, so a rank
# that exits with code 0 without starting MPI (a branch that returns before
# init()) used to leave the others there until GRADFLOW_INIT_TIMEOUT (300 s);
# gradflowrun now sees it and stops the job within seconds (supervise.py).
MPI_START_ENV = "GRADFLOWRUN_MPI_START_FILE"
# Beside those, for MPI started by the program itself (mpi4py imported before
# init()): <path>.init holds the COMM_WORLD ranks init()'s communicator
# waits for, <path>.ready says init() returned, and <path>.left that the
# process is exiting with MPI up and init() never called (mpi4py's
# MPI_Finalize comes next and waits for the others, so its exit code never
# shows). Ranks in init() waiting for a rank that left used to wait
# GRADFLOW_TIMEOUT; gradflowrun now stops the job within seconds.
# Diagnostics: with this set to 1, a rank that gradflowrun stops (SIGTERM:
# the grace period after a failure, or the user's stop) first prints every
# Python thread's stack to stderr (faulthandler), then dies as before. For a
# rank that stays silent after a peer failed: where was it?
STACKS_ENV = "GRADFLOWRUN_STACKS_ON_STOP"

_watching = False
_lock = threading.Lock()


def describe_exit(rank: object, code: int) -> str:
    """'rank 1 was killed by SIGKILL' / 'rank 1 exited with code 3' from a
    wrapper's exit code (128 + signal number for a signal death)."""
    if code > 128:
        try:
            return f"rank {rank} was killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"rank {rank} exited with code {code}"


def open_channel() -> Tuple[int, int, Dict[str, str]]:
    """Wrapper side: (read fd for the child, write fd, env for the child).
    The read end is inheritable; close it in the wrapper after starting the child."""
    r, w = os.pipe()
    os.set_inheritable(r, True)
    st = os.fstat(r)
    return r, w, {FD_ENV: str(r), ID_ENV: f"{st.st_dev}:{st.st_ino}"}


def send(fd: int, message: str) -> bool:
    """Wrapper side: deliver one notice (a single line); never raises.
    Returns whether it was delivered: False when no process holds the read
    end any more (the rank is dead, EPIPE), so a rank that died before the
    notice is not taken for one that was told (rank_wrapper.py)."""
    data = (" ".join(message.split())[:_MAX_MESSAGE] + "\n").encode("utf-8", "replace")
    try:
        os.write(fd, data)  # < PIPE_BUF: one atomic write, the pipe is empty
    except OSError:
        return False
    return True


def report_peer_failure(environ=None) -> None:
    """Rank side: record that this rank's failure is a consequence of a
    peer's (no-op outside gradflowrun); never raises, never follows a link."""
    _create((os.environ if environ is None else environ).get(PEER_FAILURE_ENV))


def report_own_failure(environ=None) -> None:
    """Rank side: record that an exception of this rank's own ends it (no-op
    outside gradflowrun); never raises, never follows a link."""
    _create((os.environ if environ is None else environ).get(OWN_FAILURE_ENV))


def report_finished(environ=None) -> None:
    """Rank side: record that the program ended gradflow in order (no-op
    outside gradflowrun); never raises, never follows a link."""
    _create((os.environ if environ is None else environ).get(FINISHED_ENV))


def report_mpi_start(stage: str, environ=None) -> None:
    """Rank side: `stage` "wait" (MPI's start-up begins) or "up" (done);
    no-op outside gradflowrun; never raises, never follows a link."""
    path = (os.environ if environ is None else environ).get(MPI_START_ENV)
    _create(f"{path}.{stage}" if path else None)


def report_init_wait(world_ranks, environ=None) -> None:
    """Rank side: init() now waits for these COMM_WORLD ranks (<path>.init,
    written whole); no-op outside gradflowrun; never raises."""
    path = (os.environ if environ is None else environ).get(MPI_START_ENV)
    if not path:
        return
    tmp = f"{path}.init.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(" ".join(str(int(r)) for r in world_ranks) + "\n")
        os.replace(tmp, f"{path}.init")
    except (OSError, ValueError, TypeError):
        pass


def _create(path: Optional[str]) -> None:
    if not path:
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


def _claim(environ: Dict[str, str]) -> Optional[int]:
    """The inherited read fd if the variables name a pipe that really is ours."""
    fd_text, ident = environ.pop(FD_ENV, None), environ.pop(ID_ENV, None)
    if not fd_text or not fd_text.isdigit() or not ident:
        return None
    fd = int(fd_text)
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISFIFO(st.st_mode) or f"{st.st_dev}:{st.st_ino}" != ident:
        return None
    os.set_inheritable(fd, False)  # the rank's own children must not hold it
    return fd


def watch(on_notice: Callable[[str], None], environ=None) -> bool:
    """Rank side: if started by gradflowrun, start a daemon thread that calls
    ``on_notice(message)`` when the wrapper reports a dead peer. Idempotent;
    returns whether a channel was found. The variables are removed from the
    environment so that processes this rank starts do not claim the pipe."""
    global _watching
    with _lock:
        if _watching:
            return True
        fd = _claim(os.environ if environ is None else environ)
        if fd is None:
            return False
        _watching = True
    if ((os.environ if environ is None else environ).get(STACKS_ENV) == "1"
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
            and threading.current_thread() is threading.main_thread()):
        faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)

    def run() -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            line = f.readline(_MAX_MESSAGE + 1)  # EOF (the wrapper is gone): nothing to do
        message = line.decode("utf-8", "replace").strip()
        if message:
            # Said here too: a rank busy outside gradflow is stopped by the
            # launcher's grace period before any collective could say it.
            print(f"gradflow: {message}; gradflow collectives on this rank now fail",
                  file=sys.stderr, flush=True)
            on_notice(message)

    threading.Thread(target=run, name="gradflowrun-notice", daemon=True).start()
    return True
