"""The coordination loop's pacing: idle backoff on by default and off when
GRADFLOW_IDLE_CYCLE_MAX equals the cycle time (idle_backoff_script.py); one
exchange per synchronous call when calls come back to back
(back_to_back_script.py)."""
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


@pytest.mark.parametrize("n", [2, 3, 4])
def test_back_to_back_calls_cost_one_exchange_each(n):
    # A 5 ms cycle time: a rank whose next call is late by up to 5 ms (a
    # loaded CI machine) still causes no extra exchange; the old pacing
    # exchanged at once after work whatever the cycle time.
    out = run_mpi(n, "back_to_back_script.py", env={"GRADFLOW_CYCLE_TIME": "5"}, timeout=120)
    assert out.stdout.count("back to back OK") == n, out.stdout
