"""Runs a test script under the MPI launcher with a timeout (the one way
parallel tests start processes). Ranks > cores are fine: MPICH is told to
yield while polling so oversubscribed runs stay fast.

GRADFLOW_TEST_LAUNCHER=openmpi runs them with Open MPI's mpirun instead
(scripts/openmpi_check.sh: gradflow and mpi4py built against Open MPI);
tests that rely on MPICH's hydra launcher skip there (skip_unless_hydra)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def in_place_build() -> bool:
    """True if the source tree has its own built extension (developer mode);
    otherwise the installed gradflow is tested."""
    return bool(glob.glob(os.path.join(ROOT, "gradflow", "_native*.so"))) and \
        not os.environ.get("GRADFLOW_TEST_INSTALLED")


def run_cwd() -> str:
    """Working directory for subprocesses: the source tree in developer mode,
    else a neutral directory so `import gradflow` finds the installed package
    rather than the unbuilt sources."""
    import tempfile
    return ROOT if in_place_build() else tempfile.gettempdir()


def rank_env() -> Dict[str, str]:
    """Environment for test ranks: this one, plus the gradflow under test on
    PYTHONPATH in developer mode, MPICH yielding while it polls (ranks may
    outnumber cores), one OpenMP thread and quiet TensorFlow."""
    env = dict(os.environ)
    env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    if in_place_build():
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("OMP_NUM_THREADS", "1")
    # The auto sparse policy's choice follows measured timings; tests that
    # model CSC exactly need CSC on every step (test_sparse_policy.py sets auto).
    env.setdefault("GRADFLOW_SPARSE_POLICY", "always")
    return env


def launcher() -> str:
    """'openmpi' under GRADFLOW_TEST_LAUNCHER=openmpi, else 'hydra' (the
    mpich wheel's mpiexec, the default)."""
    kind = os.environ.get("GRADFLOW_TEST_LAUNCHER", "hydra")
    if kind not in ("hydra", "openmpi"):
        raise ValueError(f"GRADFLOW_TEST_LAUNCHER={kind!r}: use hydra or openmpi")
    return kind


def skip_unless_hydra(reason: str):
    """pytest mark: skip a test that depends on MPICH's hydra launcher when the
    tests run under Open MPI, saying why."""
    import pytest  # noqa: PLC0415 - the scripts import this module without pytest
    return pytest.mark.skipif(launcher() != "hydra", reason=f"hydra only: {reason}")


def gradflowrun_args() -> list:
    """gradflowrun options that pick the launcher the tests run under."""
    return ["--launcher", "openmpi"] if launcher() == "openmpi" else []


def mpiexec() -> str:
    if launcher() == "openmpi":
        return os.environ.get("GRADFLOW_MPIEXEC") or shutil.which("mpirun") or "mpirun"
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else (shutil.which("mpiexec") or "mpiexec")


def gradflowrun(*args: str, timeout: float = 120,
                env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run gradflowrun with `args` (its options, then the command) under the
    launcher the tests use; returns the result whatever its exit code."""
    full_env = dict(os.environ)
    full_env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if in_place_build():
        full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "gradflow.runner.launch", *gradflowrun_args(), *args]
    try:
        return subprocess.run(cmd, cwd=run_cwd(), env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout} s\n"
                             f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}") from None


def run_mpi(n: int, script: str, *args: str, timeout: float = 180,
            env: Optional[Dict[str, str]] = None, expect_fail: bool = False,
            mpi_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run `script` (a path, or a name relative to tests/parallel) on `n` ranks.
    Asserts exit code 0 (or non-zero with expect_fail) and returns the result."""
    path = script if os.path.isabs(script) else os.path.join(HERE, script)
    full_env = rank_env()
    if env:
        full_env.update(env)
    if launcher() == "openmpi":
        # Ranks may outnumber cores; as root Open MPI also wants the
        # OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) variables (scripts/openmpi_check.sh).
        mpi_args = ["--oversubscribe", *mpi_args]
    cmd = [mpiexec(), *mpi_args, "-n", str(n), sys.executable, path, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout} s\n"
                             f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}") from None
    ok = (proc.returncode != 0) if expect_fail else (proc.returncode == 0)
    assert ok, (f"{' '.join(cmd)} exited with {proc.returncode}\n"
                f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


def host_discovery(tmp_path: Path, hosts: str) -> Tuple[Path, Path]:
    """For an elastic job whose hosts change while it runs: a host file in
    tmp_path holding `hosts` ("localhost:2\\n") and an executable discovery
    script that prints it (gradflowrun --host-discovery-script). A test
    rewrites the file to add or remove hosts. Returns (host file, script)."""
    host_file = tmp_path / "hosts.txt"
    host_file.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {host_file}\n")
    script.chmod(0o755)
    return host_file, script


def write_hosts(host_file: Path, hosts: str) -> None:
    """Replace the host file's content at once (a new file renamed over it):
    rewritten in place, the discovery script could read it empty or cut
    short and the driver would remove hosts (a suspect of a flake of
    test_elastic's grow(); the driver now waits for a second answer)."""
    tmp = host_file.with_name(host_file.name + ".tmp")
    tmp.write_text(hosts)
    os.replace(tmp, host_file)


def change_hosts_after_first_step(job: subprocess.Popen, log_dir: Path, host_file: Path,
                                  hosts: str, wait_s: float) -> None:
    """Waits until a worker of `job` has logged a step (a '"step"' event in a
    file of log_dir; the elastic test scripts' ELASTIC_LOG), the job ended,
    or wait_s passed; then writes `hosts` to the host file."""
    deadline = time.time() + wait_s
    while time.time() < deadline and job.poll() is None:
        if any('"step"' in f.read_text() for f in log_dir.iterdir()):
            break
        time.sleep(0.2)
    write_hosts(host_file, hosts)
