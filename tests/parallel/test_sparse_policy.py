"""GRADFLOW_SPARSE_POLICY=auto under mpiexec (issue 16 target 3): per-rank
fixed cost schedules force dense and sparse steps, and rank-local
preferences that the summed costs overrule; results against a numpy CSC
model (pool path fp32/fp16 wire, classic path with GradScaler), bitwise
identical on every rank, sent + residual == sum of gradients; and the
measured policy on real timings."""
import importlib.util

import pytest

from _launch import run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")

ENV = {"GRADFLOW_SPARSE_POLICY": "auto", "GRADFLOW_SPARSE_CHUNK": "64",
       "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}


def _oks(out, n):
    return [line for line in out.stdout.splitlines() if line.startswith("ok ") and f"(size {n})" in line]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_auto_policy_fixed_costs_match_model(n):
    out = run_mpi(n, "sparse_policy_script.py", "fixed", env=ENV, timeout=300)
    assert len(_oks(out, n)) == 4, out.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_auto_policy_measured_identical_and_conserved(n):
    out = run_mpi(n, "sparse_policy_script.py", "measured", env=ENV, timeout=240)
    assert len(_oks(out, n)) == 1, out.stdout
