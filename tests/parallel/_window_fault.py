"""Builds die_in_window_creation.c (a rank's death inside a two-sync window's
creation, through MPI's profiling interface) once per test session with the
MPI C wrapper of the MPI the tests run on, and gives the environment that
makes the test scripts load it (GRADFLOW_TEST_WINDOW_FAULT_LIB)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict

from _launch import HERE, launcher


def _mpicc() -> str:
    """$GRADFLOW_TEST_MPICC; under Open MPI (scripts/openmpi_check.sh) the
    mpicc on PATH, gradflow's build there; else the mpich wheel's beside
    Python (gradflow's build dependency, as in setup.py), then PATH."""
    if os.environ.get("GRADFLOW_TEST_MPICC"):
        return os.environ["GRADFLOW_TEST_MPICC"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if launcher() != "openmpi" and os.path.exists(beside):
        return beside
    found = shutil.which("mpicc")
    assert found, "no mpicc: the mpich wheel puts one beside python (or set GRADFLOW_TEST_MPICC)"
    return found


@functools.lru_cache(maxsize=None)
def fault_lib() -> str:
    """Path of the built library (built on the first call, ~0.1 s)."""
    out = os.path.join(tempfile.mkdtemp(prefix="gradflow-window-fault-"), "libdiewin.so")
    cmd = [_mpicc(), "-shared", "-fPIC", "-O1", os.path.join(HERE, "die_in_window_creation.c"),
           "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
    return out


def fault_env() -> Dict[str, str]:
    """Environment for the ranks of a script that arms the library."""
    return {"GRADFLOW_TEST_WINDOW_FAULT_LIB": fault_lib()}
