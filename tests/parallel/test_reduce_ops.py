"""Reduce ops with Horovod's integer values (Average=0, Sum=1, Adasum=2, Min=3,
Max=4, Product=5) and Horovod's deprecated average= on the numpy, torch and
TensorFlow APIs, on 2 and 3 ranks against numpy references (Adasum against
the model in _adasum_model.py at 2 ranks); unknown ints, average+op and
Adasum where it cannot run (reducescatter, 3 ranks) raise on every rank and
the runtime keeps working."""
import importlib.util

import pytest

from _launch import run_mpi

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}


def _oks(out, n, what):
    # (ranks' lines may interleave on one line: count occurrences, not lines)
    return out.stdout.count(f"ok {what} (size {n})")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_reduce_ops_numpy_torch(n):
    out = run_mpi(n, "reduce_ops_script.py", "torch", timeout=180)
    for what in ("numpy", "torch", "done"):
        assert _oks(out, n, what) == n, out.stdout + out.stderr


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="tensorflow is not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_reduce_ops_tensorflow(n):
    out = run_mpi(n, "reduce_ops_script.py", "tf", env=TF_ENV, timeout=300)
    for what in ("numpy", "tf", "done"):
        assert _oks(out, n, what) == n, out.stdout + out.stderr
