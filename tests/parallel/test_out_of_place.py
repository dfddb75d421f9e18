"""The out-of-place allreduce (numpy API) against the in-place path on the
same data, bit for bit, for every dtype and op, at 2, 3 and 4 ranks, with
pieces small enough that each ring segment moves in several (Note
[Out-of-place ring], native/ring_allreduce.cc); with another algorithm the
input is copied first and the results are the same."""
import importlib.util

import pytest

from _launch import run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_out_of_place_ring_matches_in_place(n):
    out = run_mpi(n, "out_of_place_script.py", "ring", timeout=240,
                  env={"GRADFLOW_ALLREDUCE_ALGO": "ring", "GRADFLOW_RING_PIPELINE_BYTES": "4096"})
    assert out.stdout.count("ok out-of-place") == n, out.stdout + out.stderr


@pytest.mark.parametrize("algo", ["two-sync", "recursive-doubling"])
def test_out_of_place_other_algorithms_copy(algo):
    out = run_mpi(3, "out_of_place_script.py", algo, timeout=240,
                  env={"GRADFLOW_ALLREDUCE_ALGO": algo})
    assert out.stdout.count("ok out-of-place") == 3, out.stdout + out.stderr
