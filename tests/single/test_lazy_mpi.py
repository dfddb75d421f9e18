"""`import gradflow` (and its framework modules) must not start MPI: MPI is
initialized by `gradflow.init()` (issue 17.6). Checked in a fresh process:
mpi4py.MPI is not even imported until init(), and init() then brings MPI up
at MPI_THREAD_MULTIPLE."""
import os
import subprocess
import sys

import pytest

import gradflow

SRC = os.path.dirname(os.path.dirname(os.path.abspath(gradflow.__file__)))


@pytest.mark.parametrize("modules", ["gradflow", "gradflow, gradflow.torch, gradflow.keras"])
def test_import_does_not_start_mpi(modules, tmp_path):
    code = f"""
import sys
import {modules}
assert "mpi4py.MPI" not in sys.modules, "import started MPI"
import gradflow
try:
    gradflow.rank()
except ValueError as e:
    assert "init" in str(e), e
else:
    raise AssertionError("rank() before init() did not raise")
assert "mpi4py.MPI" not in sys.modules
gradflow.init()
from mpi4py import MPI
assert MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE
assert gradflow.size() == 1 and gradflow.rank() == 0
gradflow.shutdown()
print("lazy OK")
"""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    # cwd outside the source tree: `python -c` puts the cwd first on sys.path,
    # which under GRADFLOW_TEST_INSTALLED would shadow the installed package
    # with the unbuilt source tree.
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "lazy OK" in r.stdout, r.stdout + r.stderr
