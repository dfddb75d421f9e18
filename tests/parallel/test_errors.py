"""Bad input raises on every rank; dead ranks make the others raise."""
import time

import pytest

from _launch import run_mpi

STALL = {"GRADFLOW_STALL_SHUTDOWN_TIME": "3", "GRADFLOW_STALL_CHECK_TIME": "1"}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bad_input_raises_everywhere(n):
    out = run_mpi(n, "errors_script.py", env=STALL, timeout=120)
    assert f"errors OK on {n} ranks" in out.stdout
    if n > 1:
        assert "missing on ranks" in out.stderr  # the stall warning names the ranks


@pytest.mark.parametrize("exit_code", [0, 3])
def test_dead_rank_makes_others_raise(exit_code):
    t0 = time.time()
    out = run_mpi(3, "dead_rank_script.py", str(exit_code), env={"GRADFLOW_TIMEOUT": "5"},
                  timeout=120, expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    elapsed = time.time() - t0
    for r in (0, 2):
        assert f"rank {r} raised" in out.stdout, out.stdout
    assert "timed out after 5 s" in out.stdout
    assert elapsed < 60


def test_exception_on_one_rank_aborts_the_others():
    out = run_mpi(3, "raising_rank_script.py", env={"GRADFLOW_TIMEOUT": "30"}, timeout=120,
                  expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    for r in (0, 2):
        assert f"rank {r} raised" in out.stdout, out.stdout
    assert "rank 1 failed: ValueError: boom on rank 1" in out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_every_wait_is_bounded(n):
    # Default stall settings: only GRADFLOW_TIMEOUT may end a wait that
    # cannot complete; a busy rank must not trip it.
    out = run_mpi(n, "bounded_wait_script.py", "6", env={"GRADFLOW_TIMEOUT": "6"}, timeout=180)
    assert f"bounded waits OK on {n} ranks" in out.stdout
