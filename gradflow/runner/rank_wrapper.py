"""Per-rank wrapper started by gradflowrun under mpiexec: runs the user's
command, prefixes each output line with the rank (``[1]<stdout>: ...``,
carriage-return updates included: output_pump.py),
tees it to per-rank log files and records start and exit status for the
launcher. Standard library only; run by path so it never imports gradflow.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Dict, List, Mapping, Optional, Tuple

try:
    from . import notice as _notice
    from .output_pump import pump as _pump, write_all as _write_all
except ImportError:  # run by path (as gradflowrun does): this folder is on sys.path
    import notice as _notice  # type: ignore[no-redef]
    from output_pump import pump as _pump, write_all as _write_all  # type: ignore[no-redef]

# Set by the launcher (see launch.py); not GRADFLOW_* so config.cc ignores them.
STATUS_DIR_ENV = "GRADFLOWRUN_STATUS_DIR"
OUTPUT_DIR_ENV = "GRADFLOWRUN_OUTPUT_DIR"
RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
NOTICE_FILE = "notice"  # in the status dir: gradflowrun's word that a rank failed
NOTICE_POLL_SECONDS = 0.1
# Set by the launcher when its stdout / stderr is a terminal: the pump then
# shows an unfinished line (a progress bar's latest state) after a pause.
TTY_ENV = {"stdout": "GRADFLOWRUN_STDOUT_TTY", "stderr": "GRADFLOWRUN_STDERR_TTY"}


def detect_rank(environ: Mapping[str, str]) -> str:
    """The rank as the MPI launcher told it (hydra, Open MPI, PMIx, srun)."""
    for name in RANK_ENV_VARS:
        if environ.get(name, "").isdigit():
            return environ[name]
    return "?"


def write_status(status_dir: Optional[str], rank: str, kind: str, text: str) -> None:
    """Atomically write ``status_dir/rank.<rank>.<kind>``; silently skipped when
    the directory is absent (e.g. a remote host without a shared filesystem)."""
    if not status_dir or not os.path.isdir(status_dir):
        return
    path = os.path.join(status_dir, f"rank.{rank}.{kind}")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def open_log_dir(output_dir: str, rank: str) -> int:
    """A descriptor of ``output_dir/rank.<rank>`` (created if needed) that is
    not a symbolic link, for open_log(); raises OSError otherwise."""
    rank_dir = os.path.join(output_dir, f"rank.{rank}")
    os.makedirs(rank_dir, exist_ok=True)
    # O_NOFOLLOW: a rank.N planted as a link to elsewhere is refused (ELOOP).
    return os.open(rank_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_log(dir_fd: int, name: str) -> BinaryIO:
    """Create ``name`` in ``dir_fd`` afresh: an old file (or a planted link,
    hard or symbolic) is unlinked, never followed or truncated; O_EXCL fails
    if one reappears in between."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dir_fd)
    return os.fdopen(fd, "wb")


def exit_line(code: int, stopped: bool = False, notified: bool = False,
              finished: bool = False, own: bool = False, ended: Optional[float] = None) -> str:
    """An exit status file's line: code stopped notified finished own ended.
    ended is the wall-clock time (default: now) at which this wrapper saw
    the command end: the launcher orders the failures one poll of its
    status files finds by it (supervise.failure_order)."""
    flags = " ".join("1" if f else "0" for f in (stopped, notified, finished, own))
    return f"{code} {flags} {time.time() if ended is None else ended:.6f}\n"


def read_exit(path: str) -> Optional[Tuple[List[str], float]]:
    """An exit status file's fields (code first) and when its rank ended:
    the time written in it, or for an older line without one, the file's
    modification time; None if it cannot be read (not there yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            fields = f.read().split()
        int(fields[0])
        ended = float(fields[5]) if len(fields) > 5 else mtime
    except (OSError, ValueError, IndexError):
        return None
    return fields, ended


def failed_peers(status_dir: Optional[str], rank: str) -> List[str]:
    """How the other ranks that ended by themselves ended, from their exit
    status files (for hydra's SIGUSR1, which names no rank): failures first,
    the ranks that failed without being told of another failure before those
    that were, then in the order they ended (read_exit), so the rank
    that died first is named first, not the lowest rank number."""
    out = []
    if not status_dir:
        return out
    try:
        names = sorted(os.listdir(status_dir))
    except OSError:
        return out
    for name in names:
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "rank" or parts[2] != "exit" or parts[1] == rank:
            continue
        got = read_exit(os.path.join(status_dir, name))
        if got is None or len(got[0]) < 2:
            continue
        (code, stopped, *rest), ended = got
        told = rest[:1] == ["1"]  # it failed after being told of another failure
        if stopped == "0":
            out.append(((code == "0", told, ended), _notice.describe_exit(parts[1], int(code))))
    # Failures first; a rank that exited with code 0 may not have finalized MPI.
    return [text for _, text in sorted(out, key=lambda item: item[0])]


def _hydra_notice(status_dir: Optional[str], rank: str) -> str:
    """What hydra's SIGUSR1 means, in the words of the status files here."""
    ended = failed_peers(status_dir, rank)
    failures = [text for text in ended if not text.endswith(" with code 0")]
    if failures:
        return "; ".join(failures)
    return "a rank ended without finalizing MPI (hydra sent SIGUSR1)" + "".join(
        f"; {text}" for text in ended)


def _watch_peers(status_dir: Optional[str], rank: str, hydra_said: threading.Event,
                 fd: int, notified: threading.Event) -> None:
    """Pass the first news of a failed peer to the command's gradflow runtime
    (notice.py): gradflowrun's notice file in the status dir (local ranks,
    any launcher) or hydra's SIGUSR1 (any host: a rank ended without
    MPI_Finalize), described from the status files when they are here."""
    path = os.path.join(status_dir, NOTICE_FILE) if status_dir else None
    while True:
        hydra = hydra_said.wait(NOTICE_POLL_SECONDS if path else None)
        message = ""
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    message = f.read().strip()
            except OSError:
                pass
        if not message and hydra:
            message = _hydra_notice(status_dir, rank)
        if message:
            # Counted as told only if the command could still read it: a
            # rank killed before the notice, whose wrapper a busy machine
            # scheduled only after it, must stay the one that failed first
            # (tests/parallel/test_faults.py, the "mid" SIGKILL cases).
            if _notice.send(fd, "gradflowrun reports that " + message):
                notified.set()
            return


def _die_with_parent_fn():
    """preexec_fn: the child gets SIGKILL if this wrapper is killed (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # parent died before prctl took effect
            os._exit(137)

    return preexec


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``argv`` (the user's command) as this rank; return its exit code
    (128 + signal number when it was killed by a signal)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("rank_wrapper: no command given", file=sys.stderr)
        return 2
    rank = detect_rank(os.environ)
    status_dir = os.environ.get(STATUS_DIR_ENV)
    output_dir = os.environ.get(OUTPUT_DIR_ENV)
    logs: Dict[str, Optional[BinaryIO]] = {"stdout": None, "stderr": None}
    if output_dir:
        try:
            dir_fd = open_log_dir(output_dir, rank)
            try:
                logs = {k: open_log(dir_fd, k) for k in logs}
            finally:
                os.close(dir_fd)
        except OSError as e:
            where = os.path.join(output_dir, f"rank.{rank}")
            links = os.path.islink(where) or os.path.islink(os.path.join(where, e.filename or ""))
            why = "a symbolic link is in the way" if links or e.errno == errno.ELOOP else e.strerror
            _write_all(2, f"[{rank}]<stderr>: gradflowrun: --output-filename: cannot create "
                          f"{where}/: {why}\n".encode())
            write_status(status_dir, rank, "exit", exit_line(2))
            return 2
    write_status(status_dir, rank, "start", f"{os.getpid()} {socket.gethostname()}\n")

    # With -disable-auto-cleanup hydra tells a rank that another one ended
    # without MPI_Finalize by sending it SIGUSR1, whose default action kills
    # it even after a clean MPI_Finalize. The command inherits SIG_IGN (the
    # disposition survives exec); this wrapper takes it as a failure notice.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # Python ranks: lines arrive as printed
    notice_r, notice_w, notice_env = _notice.open_channel()
    env.update(notice_env)
    peer_failure_file = own_failure_file = finished_file = None
    if status_dir and os.path.isdir(status_dir):
        peer_failure_file = os.path.join(status_dir, f"rank.{rank}.peer_failure")
        env[_notice.PEER_FAILURE_ENV] = peer_failure_file
        own_failure_file = os.path.join(status_dir, f"rank.{rank}.own_failure")
        env[_notice.OWN_FAILURE_ENV] = own_failure_file
        finished_file = os.path.join(status_dir, f"rank.{rank}.finished")
        env[_notice.FINISHED_ENV] = finished_file
        env[_notice.MPI_START_ENV] = os.path.join(status_dir, f"rank.{rank}.mpi")
    try:
        # Own session: a signal reaches the command once, through forward().
        # close_fds=False: the MPI launcher's inherited descriptors (hydra's
        # PMI_FD) must reach the command; our own fds are non-inheritable.
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, start_new_session=True, close_fds=False,
                                 preexec_fn=_die_with_parent_fn())
    except OSError as e:
        msg = f"[{rank}]<stderr>: gradflowrun: cannot run {argv[0]!r}: {e.strerror}\n"
        _write_all(2, msg.encode())
        write_status(status_dir, rank, "exit", exit_line(127))
        return 127
    finally:
        os.close(notice_r)
    # The launcher watches this pid to date a death before this wrapper, which
    # a busy machine may schedule late, writes the exit status.
    write_status(status_dir, rank, "child", f"{child.pid}\n")
    peer_failed, notified = threading.Event(), threading.Event()
    signal.signal(signal.SIGUSR1, lambda _s, _f: peer_failed.set())
    watcher = threading.Thread(target=_watch_peers, daemon=True,
                               args=(status_dir, rank, peer_failed, notice_w, notified))
    watcher.start()

    stopped = []

    def forward(signum: int, _frame: object) -> None:
        stopped.append(signum)
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)

    pumps = [
        threading.Thread(target=_pump, daemon=True,
                         args=(pipe.fileno(), fd, f"[{rank}]<{name}>: ".encode(), logs[name],
                               os.environ.get(TTY_ENV[name]) == "1"))
        for name, pipe, fd in (("stdout", child.stdout, 1), ("stderr", child.stderr, 2))
    ]
    for t in pumps:
        t.start()
    rc = child.wait()
    ended = time.time()  # before the flags are gathered: as close to the end as we get
    # Hydra signals the others as each failed rank exits: from here on that
    # is no news, and a Python handler would be reset to the default (death)
    # while this interpreter shuts down.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    code = rc if rc >= 0 else 128 - rc
    # Status first, output after: the launcher decides which rank failed
    # first from when the status files appear, and draining the pipes can
    # take a while (a grandchild may hold them; the machine may be busy).
    # "notified": the command was told of a failed peer before it ended, or
    # its gradflow runtime reported failing because of a peer
    # (notice.report_peer_failure): its own failure is a consequence, and the
    # launcher blames the others first.
    # An exception of its own (notice.report_own_failure) wins over a notice
    # that reached it while it was exiting.
    own = bool(own_failure_file and os.path.exists(own_failure_file))
    consequence = not own and (notified.is_set() or
                               bool(peer_failure_file and os.path.exists(peer_failure_file)))
    finished = bool(finished_file and os.path.exists(finished_file))  # notice.FINISHED_ENV
    write_status(status_dir, rank, "exit",
                 exit_line(code, bool(stopped), consequence, finished, own, ended))
    for t in pumps:  # a grandchild may keep the pipes open: do not wait forever
        t.join(timeout=10.0)
    return code


if __name__ == "__main__":
    sys.exit(main())
