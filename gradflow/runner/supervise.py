"""gradflowrun's job supervision: runs mpiexec, watches the rank wrappers'
status files, stops the whole job when a rank fails, misses --start-timeout
or the user interrupts, and turns what happened into one exit code and a
message naming the failed rank(s). Knows nothing about flags or MPI flavors
(launch.py builds the command line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

try:
    from . import notice as _notice
    from .monitor_line import Monitor
    from .rank_wrapper import NOTICE_FILE, read_exit
except ImportError:  # run as a script, as launch.py allows
    import notice as _notice  # type: ignore[no-redef]
    from monitor_line import Monitor  # type: ignore[no-redef]
    from rank_wrapper import NOTICE_FILE, read_exit  # type: ignore[no-redef]

# After a rank fails, the others get time to raise their own error before the
# launcher stops them (hydra's auto-cleanup is off so they can): gradflow
# ranks learn of a peer's exception within a cycle, of any other failure
# (a signal, an exit without finishing) from the notice this launcher writes
# into the status dir, which the rank wrappers pass to the ranks' runtime
# (notice.py); without it they would wait GRADFLOW_TIMEOUT.
FAILURE_GRACE_SECONDS = 3.0
KILL_GRACE_SECONDS = 5.0  # between the stages of stopping a job (see _Stopper)
# Which rank "failed first" is decided by when its failure was seen. A rank
# killed by a signal is usually the cause and its peers the consequence, but
# a peer can notice first (MPI's shared-memory copy fails within ~0.3 s, while
# the killed rank's wrapper may not be scheduled yet on a busy machine), so a
# signal death counts as this much earlier than it was seen. Failures one
# poll finds together are ordered by when their wrappers saw them end (the
# time in the exit status files: rank_wrapper.exit_line), or, for a rank
# whose process was seen dead before its wrapper wrote, when that was seen.
SIGNAL_HEAD_START_SECONDS = 2.0
# The stop reason when a rank exited with code 0 without starting MPI while
# others wait in MPI's start-up (notice.MPI_START_ENV; _never_started_mpi),
# or left with MPI up while others wait in init() for it (_left_without_init).
MPI_START_WHY = "a rank exited before starting MPI"


class _Stopper:
    """Stops mpiexec in stages: the first signal (SIGTERM, or the user's
    SIGINT), then SIGINT (hydra's "force abort": SIGKILL to every rank) after
    KILL_GRACE_SECONDS, then SIGKILL of mpiexec after as long again."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.stage, self.since, self.why = proc, 0, 0.0, ""

    def start(self, signum: int, why: str) -> None:
        if self.stage == 0:
            self.why = why
            self._send(signum)

    def escalate(self, force: bool = False) -> None:
        if self.stage and (force or time.monotonic() - self.since > KILL_GRACE_SECONDS):
            if self.stage == 1:
                self._send(signal.SIGINT)
            elif self.stage == 2:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.stage, self.since = 3, float("inf")

    def _send(self, signum: int) -> None:
        try:
            self.proc.send_signal(signum)
        except OSError:
            pass
        self.stage, self.since = self.stage + 1, time.monotonic()


def run_job(argv: List[str], env: Dict[str, str], np: int, local_ranks: Sequence[int],
            start_timeout: float, status_dir: str,
            monitor_interval: Optional[float] = None) -> int:
    """Run mpiexec until it ends; stop the job when a rank fails, a local rank
    misses --start-timeout, or on SIGINT/SIGTERM/SIGHUP (a second one skips the
    grace period); report failed ranks; return the exit code. With
    `monitor_interval`, print the ranks' live status line that often (--monitor)."""
    received: List[int] = []
    seen_at: Dict[int, float] = {}  # failed rank -> when its failure was first seen
    gone_at: Dict[int, float] = {}  # local rank -> when its process was seen dead
    gone_wall: Dict[int, float] = {}  # the same, by the wall clock (exit files' clock)
    seen = 0

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)

    # Handlers before Popen: mpiexec then starts with default dispositions,
    # even when this process was started with SIGINT ignored.
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        stdin = subprocess.DEVNULL if sys.stdin is None or sys.stdin.isatty() else None
        env = dict(env)
        for stream, var in ((sys.stdout, "GRADFLOWRUN_STDOUT_TTY"),
                            (sys.stderr, "GRADFLOWRUN_STDERR_TTY")):
            env[var] = "1" if stream is not None and stream.isatty() else "0"
        proc = subprocess.Popen(argv, env=env, stdin=stdin, start_new_session=True)
        stopper = _Stopper(proc)
        monitor = Monitor(status_dir, np, monitor_interval) if monitor_interval else None
        started, failed_at, stranded_at = time.monotonic(), None, None
        while proc.poll() is None:
            now = time.monotonic()  # one instant per poll: ranks seen together tie
            if len(received) > seen:
                if seen:
                    stopper.escalate(force=True)
                stopper.start(received[0], "interrupted")
                seen = len(received)
            statuses = _read_statuses(status_dir, np)
            for r in range(np):
                if r not in statuses and r not in gone_at and _child_gone(status_dir, r):
                    gone_at[r], gone_wall[r] = now, time.time()
            for r, st in statuses.items():
                if st.code != 0 and not st.stopped and r not in seen_at:
                    seen_at[r] = gone_at.get(r, now)
            if failed_at is None and seen_at:
                failed_at = now
                first = failure_order(seen_at, statuses, gone_wall)[0]
                write_notice(status_dir, _notice.describe_exit(first, statuses[first][0]))
            if failed_at and now - failed_at > FAILURE_GRACE_SECONDS:
                stopper.start(signal.SIGTERM, "failed")
            stranded = _stranded(status_dir, statuses, np) if stopper.stage == 0 else None
            stranded_at = (stranded_at or now) if stranded else None
            if stranded and now - stranded_at > FAILURE_GRACE_SECONDS:
                print(stranded, file=sys.stderr, flush=True)
                stopper.start(signal.SIGTERM, MPI_START_WHY)
            if stopper.stage == 0 and now - started > start_timeout:
                missing = [r for r in local_ranks if not os.path.exists(
                    os.path.join(status_dir, f"rank.{r}.start"))]
                if missing:
                    print(f"gradflowrun: rank(s) {_ranks(missing)} did not start within "
                          f"{start_timeout:g} s (--start-timeout); stopping the job",
                          file=sys.stderr, flush=True)
                    stopper.start(signal.SIGTERM, "start timeout")
            stopper.escalate()
            if monitor is not None and stopper.stage == 0:
                monitor.poll(sys.stderr)
            time.sleep(0.05)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    statuses = _read_statuses(status_dir, np)
    now = time.monotonic()  # failures that arrived with mpiexec's end: seen together
    for r, st in statuses.items():
        if st.code != 0 and not st.stopped and r not in seen_at:
            seen_at[r] = gone_at.get(r, now)
    return _report(proc.returncode, statuses, np, received, stopper.why,
                   failure_order(seen_at, statuses, gone_wall))


def _stranded(status_dir: str, statuses: Dict[int, "RankExit"], np: int) -> Optional[str]:
    """Why ranks in init() can never finish it, or None: a rank exited with
    code 0 before MPI's start-up (_never_started_mpi), or a rank is leaving
    with MPI up and without calling init() while others' init() waits for it
    (_left_without_init)."""
    stranded = _never_started_mpi(status_dir, statuses, np)
    if stranded:
        return (f"gradflowrun: rank(s) {_ranks(stranded[0])} exited with code 0 without "
                f"calling gradflow.init() while rank(s) {_ranks(stranded[1])} wait for them in "
                "init() (MPI's start-up waits for every rank and would give up only after "
                "GRADFLOW_INIT_TIMEOUT); stopping the job: every rank must call gradflow.init()")
    stranded = _left_without_init(status_dir, statuses, np)
    if stranded:
        return (f"gradflowrun: rank(s) {_ranks(stranded[0])} ended without calling "
                f"gradflow.init() (MPI was started, and MPI_Finalize waits for the other ranks) "
                f"while rank(s) {_ranks(stranded[1])} wait for them in init() (which would give "
                "up only after GRADFLOW_TIMEOUT); stopping the job: every rank of init()'s "
                "communicator must call gradflow.init()")
    return None


def _left_without_init(status_dir: str, statuses: Dict[int, "RankExit"],
                       np: int) -> Optional[Tuple[List[int], List[int]]]:
    """(ranks leaving with MPI up and init() never called, local ranks whose
    init() waits for one of them), both non-empty, or None (Note [A rank
    that leaves with MPI up and no init()] in gradflow/_exit_hooks.py). The
    latter cannot finish: init() needs every rank of its communicator."""
    def path(r: int, stage: str) -> str:
        return os.path.join(status_dir, f"rank.{r}.mpi.{stage}")

    left = {r for r in range(np) if os.path.exists(path(r, "left"))}
    if not left:
        return None
    waiting = []
    for r in range(np):
        if r in left or r in statuses or os.path.exists(path(r, "ready")):
            continue
        try:
            with open(path(r, "init"), encoding="utf-8") as f:
                members = {int(m) for m in f.read().split()}
        except (OSError, ValueError):
            continue
        if members & left:
            waiting.append(r)
    return (sorted(left), waiting) if waiting else None


def _never_started_mpi(status_dir: str, statuses: Dict[int, "RankExit"],
                       np: int) -> Optional[Tuple[List[int], List[int]]]:
    """(ranks that exited with code 0 and never began MPI's start-up, local
    ranks still in it), both non-empty, or None (notice.MPI_START_ENV). The
    latter cannot finish: MPI_Init waits for every rank."""
    def has(r: int, stage: str) -> bool:
        return os.path.exists(os.path.join(status_dir, f"rank.{r}.mpi.{stage}"))

    gone = [r for r, st in statuses.items() if st.code == 0 and not st.stopped
            and not has(r, "wait")]
    if not gone:
        return None
    waiting = [r for r in range(np) if r not in statuses and has(r, "wait") and not has(r, "up")]
    return (gone, waiting) if waiting else None


def write_notice(status_dir: str, message: str) -> None:
    """Tell the local rank wrappers that a rank failed (see rank_wrapper.py)."""
    path = os.path.join(status_dir, NOTICE_FILE)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(message + "\n")
        os.replace(path + ".tmp", path)
    except OSError:
        pass


class RankExit(NamedTuple):
    """A rank wrapper's exit status file."""

    code: int  # 128 + signal number for a signal death
    stopped: bool  # ended by a signal the launcher forwarded
    notified: bool = False  # told of a failed peer before it ended
    finished: bool = False  # its program had ended gradflow in order (notice.FINISHED_ENV)
    own: bool = False  # an exception of its own ended it (notice.OWN_FAILURE_ENV)
    ended: float = 0.0  # wall-clock time its wrapper saw it end (0: unknown)


def failure_order(seen_at: Dict[int, float], statuses: Dict[int, Tuple],
                  gone_wall: Optional[Dict[int, float]] = None) -> List[int]:
    """Failed ranks, the one to blame first: ranks that failed before being
    told of a failed peer, by when the failure was seen, a signal death moved
    SIGNAL_HEAD_START_SECONDS earlier; ties (one poll saw them): by when they
    ended, the earliest evidence of it (the exit file's time, or the wall
    time `gone_wall` says the launcher saw the process dead, if earlier),
    then killed ranks, then lower rank."""
    gone_wall = gone_wall or {}

    def key(r: int) -> Tuple[bool, float, float, bool, int]:
        st = RankExit(*statuses[r])
        killed = _killed(st.code)
        ended = min(st.ended or float("inf"), gone_wall.get(r, float("inf")))
        return (st.notified, seen_at[r] - (SIGNAL_HEAD_START_SECONDS if killed else 0.0),
                ended, not killed, r)
    return sorted((r for r in seen_at if r in statuses), key=key)


def _killed(code: int) -> bool:
    """Exit code of a process ended by a signal (wrapper: 128 + signal number)."""
    return code < 0 or code > 128


def _child_gone(status_dir: str, rank: int) -> bool:
    """True when the local rank's process (pid in its wrapper's "child" file)
    has died, as a zombie not yet reaped or gone; False if unknown."""
    try:
        with open(os.path.join(status_dir, f"rank.{rank}.child"), encoding="utf-8") as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def _read_statuses(status_dir: str, np: int) -> Dict[int, RankExit]:
    """rank -> its RankExit, from the wrappers' files."""
    out = {}
    for r in range(np):
        got = read_exit(os.path.join(status_dir, f"rank.{r}.exit"))
        if got is None or len(got[0]) < 2:
            continue
        fields, ended = got  # code stopped [notified [finished [own [ended]]]]
        out[r] = RankExit(int(fields[0]), fields[1] == "1", fields[2:3] == ["1"],
                          fields[3:4] == ["1"], fields[4:5] == ["1"], ended)
    return out


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _report(mpiexec_rc: int, statuses: Dict[int, Tuple[int, bool]], np: int,
            received: List[int], why: str, order: Sequence[int] = ()) -> int:
    """Print which ranks failed (the first one seen first) and return the exit
    code: the first failed rank's, else 128 + signal when interrupted, else
    mpiexec's."""
    failed = sorted(r for r, st in statuses.items() if st[0] != 0 and not st[1])
    failed = [r for r in order if r in failed] + [r for r in failed if r not in order]
    for r in failed:
        code = statuses[r][0]
        sig = f" ({signal.Signals(code - 128).name})" if _is_sig(code - 128) else ""
        print(f"gradflowrun: rank {r} exited with code {code}{sig}", file=sys.stderr, flush=True)
    if received:
        print(f"gradflowrun: interrupted by {signal.Signals(received[0]).name}; stopped all ranks",
              file=sys.stderr, flush=True)
        return 128 + received[0]
    if failed:
        quit_early = [r for r, st in statuses.items() if st[0] == 0]
        # A rank a signal ended (SIGKILL, SIGSEGV: 128 + signal) failed on its
        # own even if the notice of some failure reached its wrapper first
        # (test_faults' SIGKILL inside halving-doubling: the survivors'
        # notices raced the victim's, and the victim was counted as "told").
        told = all(RankExit(*statuses[r]).notified and not _is_sig(statuses[r][0] - 128)
                   for r in failed)
        others = [r for r in range(np) if r not in failed]
        # Ranks whose program had ended gradflow in order, where no failed rank
        # failed on an exception of its own: the likely cause (named below).
        ended = [r for r in others if r in statuses and RankExit(*statuses[r]).finished
                 and not any(RankExit(*statuses[f]).own for f in failed)]
        if len(failed) > 1 and told and not quit_early:
            # Every failed rank raised because of a failure it was told of and
            # none failed on its own: an error the ranks agreed on (e.g. the
            # coordinator found their steps differ) or one no survivor could
            # see the start of. Naming a rank "first" would blame an innocent one.
            print(f"gradflowrun: rank(s) {_ranks(sorted(failed))} failed on one job-wide error "
                  "(each raised because the job had failed; none failed on its own): see "
                  "their messages above", file=sys.stderr, flush=True)
        elif len(failed) > 1 and not ended:  # (ended: the cause is named below)
            print(f"gradflowrun: rank {failed[0]} failed first; rank(s) {_ranks(failed[1:])} "
                  "failed after it", file=sys.stderr, flush=True)
        if quit_early and told:
            # Told that a peer ended without finalizing MPI, and no rank failed
            # otherwise: the cause is likely a rank that exited with code 0.
            print(f"gradflowrun: the failed ranks were told that another rank ended without "
                  f"finalizing MPI; rank(s) {_ranks(quit_early)} exited with code 0",
                  file=sys.stderr, flush=True)
        if ended:
            # Its program had shut gradflow down (it ended: a last step, a
            # sys.exit(0)) while the failed ranks still had collectives to run;
            # it then waits in MPI_Finalize for them (stopped below).
            print(f"gradflowrun: rank(s) {_ranks(ended)} had already ended gradflow (the "
                  "program finished, or called shutdown()) while the failed ranks still ran "
                  "collectives; an error saying \"shutdown() was called on rank R\" comes "
                  "from that: every rank must run the same collectives (e.g. the same number "
                  "of steps)", file=sys.stderr, flush=True)
        if others and why == "failed":
            print(f"gradflowrun: stopped rank(s) {_ranks(others)} after the failure",
                  file=sys.stderr, flush=True)
        return statuses[failed[0]][0]
    if why == MPI_START_WHY:
        return 1  # said when it stopped the job
    if mpiexec_rc != 0:
        rc = mpiexec_rc if mpiexec_rc > 0 else 128 - mpiexec_rc
        if len(statuses) == np and all(st[0] == 0 for st in statuses.values()):
            # Seen with hydra's rsh launcher: mpiexec killed by SIGPIPE at
            # teardown after every rank had finished. The ranks' codes decide.
            print(f"gradflowrun: note: every rank exited with code 0; ignoring mpiexec's exit "
                  f"code {rc}", file=sys.stderr, flush=True)
            return 0
        print(f"gradflowrun: mpiexec exited with code {rc}" + (f" ({why})" if why else ""),
              file=sys.stderr, flush=True)
        return rc
    return 0


def _is_sig(n: int) -> bool:
    if n <= 0:
        return False
    try:
        signal.Signals(n)
        return True
    except ValueError:
        return False
