"""A duplicate-name refusal while the first call under the name is itself
held behind an earlier withdrawal (native Note [Withdrawing a name in
flight]; withdrawn_held_script.py): the refused call's withdrawal reaches
the other ranks, whose accepted call fails with "submitted twice", and
the next calls pair correctly (sums checked against numpy)."""
import pytest

from _launch import run_mpi


@pytest.mark.parametrize("n", [2, 3, 4])
def test_refusal_behind_a_held_call_fails_everywhere(n):
    out = run_mpi(n, "withdrawn_held_script.py", env={"GRADFLOW_TIMEOUT": "60"}, timeout=180)
    assert out.stdout.count("withdrawn held OK") == n, out.stdout + out.stderr
