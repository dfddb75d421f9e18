"""The coordination loop's pacing: idle backoff on by default and off when
GRADFLOW_IDLE_CYCLE_MAX equals the cycle time (idle_backoff_script.py)."""
import pytest

from _launch import run_mpi


@pytest.mark.parametrize("n", [2, 3])
def test_idle_backoff_by_default(n):
    out = run_mpi(n, "idle_backoff_script.py", env={"EXPECT": "backoff"}, timeout=120)
    assert out.stdout.count("idle backoff OK") == n, out.stdout


def test_backoff_off_at_the_cycle_time():
    out = run_mpi(2, "idle_backoff_script.py",
                  env={"EXPECT": "steady", "GRADFLOW_IDLE_CYCLE_MAX": "1"}, timeout=120)
    assert out.stdout.count("idle backoff OK") == 2, out.stdout
