# run_func.py — `gradflow.runner.run`, Horovod's `horovod.run`: launch a
# job that runs a Python function on every rank and return each rank's
# return value. The driver side only: it pickles the function, starts
# gradflowrun (launch.py) on `run_task.py`, forwards the job's output, and
# reads the ranks' results back. No communication logic.
"""Run a function on N ranks from Python (Horovod's ``horovod.run``).

How it works: the function and its arguments are pickled (with cloudpickle
when installed, so lambdas, closures and functions of ``__main__`` travel
by value, as under Horovod) into a fresh temporary directory, beside this
process's ``sys.path`` (the ranks add its entries they lack, so a module
next to the driver script imports there too, whatever the working
directory); gradflowrun starts ``python -m gradflow.runner.run_task <dir>``
on every rank; each rank unpickles and calls the function and writes its
return value (or its traceback) into the directory; the driver waits for
the job and returns the values in rank order. A function that ends with
``sys.exit(0)`` / ``sys.exit()`` returns None (Horovod: ``""``).

Output: when ``sys.stdout`` / ``sys.stderr`` are this process's own
streams, gradflowrun writes to them directly (exactly as on the command
line: a terminal keeps animated progress bars); when they were replaced (a
notebook, a StringIO) the job's output is copied into them, carriage
returns kept.

Called inside a rank of a running job (an MPI rank's variables set), it
raises RuntimeError: a job inside a job is almost always a script with a
``horovod.run`` branch launched under gradflowrun by mistake.

Limits, said plainly: the ranks must run on this machine (the directory is
local; ``hosts``/``hostfile`` may name only this machine's aliases), and
elastic jobs (``min_num_proc``, ``max_num_proc``, ``reset_limit``,
``cooldown_range``) are not supported; both raise ``ValueError`` before
anything starts. Gloo does not exist in gradflow (``use_gloo=True`` raises).
"""
from __future__ import annotations

import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from . import hosts as _hosts

PAYLOAD_FILE = "payload.pkl"  # (driver's sys.path, pickled (func, args, kwargs)), pickled
RESULT_FILE = "result.{rank}.pkl"  # one rank's return value, pickled
ERROR_FILE = "error.{rank}.txt"  # one rank's traceback
UNPICKLABLE_FILE = "unpicklable.{rank}.txt"  # why one rank's return value cannot be pickled
# Set on a rank by MPI launchers (rank_wrapper.RANK_ENV_VARS less SLURM_PROCID,
# which any srun step has, driver or not) and by gradflowrun itself.
RANK_MARKERS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "GRADFLOWRUN_STATUS_DIR")


def _pickler() -> Any:
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle ships with the [all] extra
        return pickle


def _local_only(hosts: Optional[str], hostfile: Optional[str]) -> None:
    """ValueError unless every host named is this machine."""
    if hosts is not None and hostfile is not None:
        raise ValueError("gradflow.runner.run: give hosts or hostfile, not both")
    listed = (_hosts.parse_hosts(hosts) if hosts is not None
              else _hosts.read_hostfile(hostfile) if hostfile is not None else [])
    remote = [h.name for h in listed if not _hosts.is_local_host(h.name)]
    if remote:
        raise ValueError(f"gradflow.runner.run starts ranks on this machine only (the function "
                         f"and the results travel through a local directory); {remote} "
                         f"{'is' if len(remote) == 1 else 'are'} not this machine: use "
                         f"gradflowrun with a script there")


def _not_in_a_rank() -> None:
    """RuntimeError when this process is a rank of a running job."""
    marker = next((m for m in RANK_MARKERS if m in os.environ), None)
    if marker is not None:
        raise RuntimeError(
            f"gradflow.runner.run was called inside a rank of a running job ({marker} is set): "
            f"it starts a job of its own, so call it from a plain Python process (python "
            f"script.py, a notebook), not from a script run by gradflowrun / mpiexec / "
            f"horovod.run; under gradflowrun, run the function directly instead")


def _own_stream(stream: TextIO, original: Optional[TextIO]) -> Optional[int]:
    """The file descriptor gradflowrun may write to directly, or None when the
    stream was replaced (notebook, StringIO) and its output must be copied."""
    if stream is not original or stream is None:
        return None
    try:
        stream.flush()  # what this process printed comes first
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _forward(stream: Any, to: Callable[[], TextIO]) -> None:
    # newline="": a progress bar's "\r" stays "\r" (a notebook redraws the line)
    for line in io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline=""):
        out = to()
        out.write(line)
        out.flush()


def _command(workdir: str, num_proc: int, hosts: Optional[str], hostfile: Optional[str],
             start_timeout: Optional[float], mpi_args: Optional[str],
             output_filename: Optional[str], verbose: Optional[bool],
             network_interface: Optional[str], ssh_port: Optional[int],
             ssh_identity_file: Optional[str], executable: Optional[str],
             extra_args: Sequence[str]) -> List[str]:
    argv = [sys.executable, "-m", "gradflow.runner.launch", "-np", str(num_proc)]
    for flag, value in (("-H", hosts), ("--hostfile", hostfile),
                        ("--start-timeout", start_timeout), ("--mpi-args", mpi_args),
                        ("--output-filename", output_filename),
                        ("--network-interface", network_interface), ("--ssh-port", ssh_port),
                        ("--ssh-identity-file", ssh_identity_file)):
        if value is not None:
            argv += [flag, str(value)]
    if verbose:
        argv.append("--verbose")
    argv += list(extra_args)
    return argv + [executable or sys.executable, "-m", "gradflow.runner.run_task", workdir]


def _stop(proc: subprocess.Popen) -> None:
    """End gradflowrun and its job: SIGTERM (gradflowrun stops its ranks in
    stages, within ~6 s); a second Ctrl-C meanwhile, or 30 s without an
    exit, sends SIGINT, gradflowrun's "skip the grace period"."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except BaseException:  # noqa: BLE001 - a second Ctrl-C, or the timeout
        proc.send_signal(signal.SIGINT)
        proc.wait()


def _results(workdir: str, num_proc: int, returncode: int) -> List[Any]:
    errors = {}
    for rank in range(num_proc):
        path = os.path.join(workdir, ERROR_FILE.format(rank=rank))
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                errors[rank] = (os.path.getmtime(path), f.read())
    if errors:
        first = min(errors, key=lambda r: (errors[r][0], r))
        others = sorted(r for r in errors if r != first)
        also = f" (ranks {others} raised too)" if others else ""
        raise RuntimeError(f"gradflow.runner.run: the function raised on rank {first}{also}; "
                           f"its traceback:\n{errors[first][1]}")
    for rank in range(num_proc):
        path = os.path.join(workdir, UNPICKLABLE_FILE.format(rank=rank))
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                raise RuntimeError(f"gradflow.runner.run: rank {rank}'s function returned a value "
                                   f"that cannot be pickled, so it cannot be sent back: "
                                   f"{f.read()}")
    if returncode != 0:
        raise RuntimeError(f"gradflow.runner.run: the job failed with exit code {returncode} "
                           f"and no rank's function raised: gradflowrun's output above says why "
                           f"(a rank that ended, or an argument it refused)")
    values = []
    for rank in range(num_proc):
        path = os.path.join(workdir, RESULT_FILE.format(rank=rank))
        if not os.path.exists(path):
            raise RuntimeError(f"gradflow.runner.run: the job succeeded but rank {rank} left no "
                               f"result (did the function end its process, e.g. os._exit()?)")
        with open(path, "rb") as f:
            values.append(pickle.load(f))
    return values


def run(func: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None,
        num_proc: int = 1, min_num_proc: Optional[int] = None,
        max_num_proc: Optional[int] = None, slots: Optional[int] = None,
        reset_limit: Optional[int] = None, cooldown_range: Optional[Sequence[int]] = None,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        start_timeout: Optional[float] = None, ssh_port: Optional[int] = None,
        ssh_identity_file: Optional[str] = None, disable_cache: Optional[bool] = None,
        output_filename: Optional[str] = None, verbose: Optional[bool] = None,
        use_gloo: Optional[bool] = None, use_mpi: Optional[bool] = None,
        mpi_args: Optional[str] = None, network_interface: Optional[str] = None,
        executable: Optional[str] = None, np: Optional[int] = None,
        min_np: Optional[int] = None, max_np: Optional[int] = None,
        extra_args: Sequence[str] = ()) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks (default 1) of a
    new gradflow job and return the list of their return values, index =
    rank (Horovod's ``horovod.run``, same arguments). ``func`` calls
    ``init()`` itself, as a script would. A rank whose function raises
    makes ``run`` raise ``RuntimeError`` with that rank's traceback (the
    first to raise); a job that fails otherwise (a rank killed) raises
    naming the exit code. ``np``/``min_np``/``max_np`` are Horovod's
    deprecated spellings. ``extra_args``: more gradflowrun flags (e.g.
    ``["--sparse-ratio", "0.01"]``). ``disable_cache`` changes nothing
    (gradflowrun caches no checks). Ranks run on this machine only, and
    elastic arguments are refused (``ValueError``): see the module docstring."""
    if np is not None:  # as Horovod: np counts unless num_proc was changed from 1
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning, stacklevel=2)
        num_proc = np if num_proc == 1 else num_proc
    min_num_proc = min_np if min_num_proc is None else min_num_proc
    max_num_proc = max_np if max_num_proc is None else max_num_proc
    if not callable(func):
        raise TypeError(f"gradflow.runner.run: func must be callable, got {type(func).__name__}")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"gradflow.runner.run: num_proc must be a positive int, got {num_proc!r}")
    elastic = {"min_num_proc": min_num_proc, "max_num_proc": max_num_proc, "slots": slots,
               "reset_limit": reset_limit, "cooldown_range": cooldown_range}
    given = [k for k, v in elastic.items() if v is not None]
    if given:
        raise ValueError(f"gradflow.runner.run does not run elastic jobs ({', '.join(given)} "
                         f"given): use gradflowrun --min-np/--max-np with a script")
    if use_gloo:
        raise ValueError("gradflow.runner.run: gradflow runs over MPI only (use_gloo=True)")
    del disable_cache, use_mpi  # MPI is the only controller; nothing is cached
    _local_only(hosts, hostfile)
    _not_in_a_rank()
    workdir = tempfile.mkdtemp(prefix="gradflow-run-")
    try:
        try:
            payload = _pickler().dumps((func, tuple(args), dict(kwargs or {})))
        except Exception as e:
            raise ValueError(f"gradflow.runner.run: cannot pickle the function or its arguments "
                             f"({type(e).__name__}: {e})") from e
        with open(os.path.join(workdir, PAYLOAD_FILE), "wb") as f:
            pickle.dump(([p for p in sys.path if isinstance(p, str)], payload), f)
        argv = _command(workdir, num_proc, hosts, hostfile, start_timeout, mpi_args,
                        output_filename, verbose, network_interface, ssh_port,
                        ssh_identity_file, executable, extra_args)
        out_fd = _own_stream(sys.stdout, sys.__stdout__)
        err_fd = _own_stream(sys.stderr, sys.__stderr__)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE if out_fd is None else out_fd,
                                stderr=subprocess.PIPE if err_fd is None else err_fd)
        try:  # from Popen on, a Ctrl-C anywhere must end the job
            pumps = [threading.Thread(target=_forward, args=(pipe, to), daemon=True)
                     for pipe, to in ((proc.stdout, lambda: sys.stdout),
                                      (proc.stderr, lambda: sys.stderr)) if pipe is not None]
            for t in pumps:
                t.start()
            returncode = proc.wait()
        except BaseException:  # Ctrl-C: end the job (gradflowrun forwards it to the ranks)
            _stop(proc)
            raise
        for t in pumps:
            t.join()
        return _results(workdir, num_proc, returncode)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
