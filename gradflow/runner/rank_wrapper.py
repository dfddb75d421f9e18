"""Per-rank wrapper started by gradflowrun under mpiexec: runs the user's
command, prefixes each output line with the rank (``[1]<stdout>: ...``),
tees it to per-rank log files and records start and exit status for the
launcher. Standard library only; run by path so it never imports gradflow.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import BinaryIO, List, Mapping, Optional

# Set by the launcher (see launch.py); not GRADFLOW_* so config.cc ignores them.
STATUS_DIR_ENV = "GRADFLOWRUN_STATUS_DIR"
OUTPUT_DIR_ENV = "GRADFLOWRUN_OUTPUT_DIR"
RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_MAX_LINE = 1 << 16  # longer lines are split, never held back indefinitely


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[n:]


def _pump(src: BinaryIO, fd: int, prefix: bytes, log_path: Optional[str]) -> None:
    """Copy ``src`` to ``fd`` line by line, one write per prefixed line, so
    mpiexec keeps lines from different ranks intact."""
    log = open(log_path, "wb") if log_path else None
    try:
        while True:
            line = src.readline(_MAX_LINE)
            if not line:
                break
            if log:
                log.write(line)
                log.flush()
            if not line.endswith(b"\n"):
                line += b"\n"
            _write_all(fd, prefix + line)
    finally:
        if log:
            log.close()


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
    logs = {"stdout": None, "stderr": None}
    if output_dir:
        rank_dir = os.path.join(output_dir, f"rank.{rank}")
        os.makedirs(rank_dir, exist_ok=True)
        logs = {k: os.path.join(rank_dir, k) for k in logs}
    write_status(status_dir, rank, "start", f"{os.getpid()} {socket.gethostname()}\n")

    # With -disable-auto-cleanup hydra tells a rank that another one ended by
    # sending it SIGUSR1, whose default action kills it even after a clean
    # MPI_Finalize. Ignored here, ignored in the command (the disposition
    # survives exec); gradflow detects dead peers by GRADFLOW_TIMEOUT instead.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # Python ranks: lines arrive as printed
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
        write_status(status_dir, rank, "exit", "127 0\n")
        return 127

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
        threading.Thread(target=_pump, args=(child.stdout, 1, f"[{rank}]<stdout>: ".encode(),
                                             logs["stdout"]), daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, 2, f"[{rank}]<stderr>: ".encode(),
                                             logs["stderr"]), daemon=True),
    ]
    for t in pumps:
        t.start()
    rc = child.wait()
    code = rc if rc >= 0 else 128 - rc
    # Status first, output after: the launcher decides which rank failed
    # first from when the status files appear, and draining the pipes can
    # take a while (a grandchild may hold them; the machine may be busy).
    write_status(status_dir, rank, "exit", f"{code} {1 if stopped else 0}\n")
    for t in pumps:  # a grandchild may keep the pipes open: do not wait forever
        t.join(timeout=10.0)
    return code


if __name__ == "__main__":
    sys.exit(main())
