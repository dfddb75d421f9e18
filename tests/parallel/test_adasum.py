"""op=Adasum (native/adasum_allreduce.*): results against the numpy model of
the recursive pairwise Adasum (tests/parallel/_adasum_model.py) on 1, 2, 4
and 8 ranks, bitwise identical on every rank; fused tensors keep their own dot
products; 3 ranks (not a power of two) raise a clear ValueError on every
rank; torch allreduce and DistributedOptimizer(op=Adasum) training."""
import importlib.util

import pytest

from _launch import run_mpi


def _oks(out, n, what):
    # (ranks' lines may interleave on one line: count occurrences, not lines)
    return out.stdout.count(f"ok {what} (size {n})")


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_adasum_numpy(n):
    out = run_mpi(n, "adasum_script.py", "numpy", timeout=300)
    whats = ("sizes", "special", "scaling", "fused", "refusals", "done")
    for what in whats + (("join",) if n > 1 else ()):
        assert _oks(out, n, what) == 1, out.stdout + out.stderr


def test_adasum_non_power_of_two_raises():
    out = run_mpi(3, "adasum_script.py", "nonpow2", timeout=180)
    for what in ("nonpow2", "done"):
        assert _oks(out, 3, what) == 1, out.stdout + out.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("n", [2, 4])
def test_adasum_torch(n):
    out = run_mpi(n, "adasum_script.py", "torch", timeout=400)
    for what in ("torch ops", "torch optimizer", "done"):
        assert _oks(out, n, what) == 1, out.stdout + out.stderr
