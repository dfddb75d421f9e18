"""Waits that cycle through two engines (Note [Waits across engines],
native/engine_links.h): ranks that call collectives of a process set and
of the global set (or of two models' optimizers) in different orders
used to hang for ever; now every rank raises within 1.5 x GRADFLOW_TIMEOUT
and the job ends. Progress on another engine, and a rank busy computing,
must not be taken for such a deadlock (numpy-checked results)."""
import re

import pytest

from _launch import run_mpi

SHORT = {"GRADFLOW_TIMEOUT": "4"}


def reports(stdout):
    """rank -> (seconds, message) from the script's 'rank R raised after' lines."""
    out = {}
    for m in re.finditer(r"rank (\d+) raised after ([\d.]+) s: (.*?)(?=rank \d+ raised after|\n|$)",
                         stdout):
        out[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return out


def check_every_rank_aborted(proc, n, timeout_s, pending):
    got = reports(proc.stdout)
    assert sorted(got) == list(range(n)), proc.stdout + proc.stderr
    for rank, (seconds, msg) in got.items():
        # Not before 1.5 x the timeout; well before a hang.
        assert 1.5 * timeout_s - 0.5 <= seconds < 1.5 * timeout_s + 20, (rank, seconds, msg)
        assert "called in different orders on different ranks" in msg, msg
        assert f"'{pending}' submitted by ranks [ 0 2" in msg, msg
    assert "process set 1" in got[1][1], got[1][1]  # rank 1 waited on the set


@pytest.mark.parametrize("variant,n", [("plain", 3), ("plain", 4), ("cached", 3), ("cached", 4)])
def test_collectives_of_a_set_and_the_global_set_in_different_orders(variant, n):
    args = ["cycle"] + (["cached"] if variant == "cached" else [])
    proc = run_mpi(n, "cross_engine_wait_script.py", *args, timeout=120, env=SHORT,
                   expect_fail=True)
    check_every_rank_aborted(proc, n, 4, "g")


def test_different_orders_with_default_settings():
    """GRADFLOW_TIMEOUT's default (60 s): the job ends after 90 s, not never."""
    proc = run_mpi(3, "cross_engine_wait_script.py", "cycle", timeout=240, expect_fail=True)
    check_every_rank_aborted(proc, 3, 60, "g")


@pytest.mark.parametrize("n", [3, 4])
def test_optimizers_on_overlapping_sets_with_backward_in_different_orders(n):
    pytest.importorskip("torch")
    proc = run_mpi(n, "cross_engine_wait_script.py", "torch", timeout=150, env=SHORT,
                   expect_fail=True)
    check_every_rank_aborted(proc, n, 4, "DistributedOptimizer0.glob.bias")


@pytest.mark.parametrize("n", [3, 4])
def test_a_sets_own_bounded_wait_comes_before_the_job_abort(n):
    """Ranks 0 and 1 wait on set {0, 1} under names that differ while the
    others wait on the global set for them: the set's own bounded wait fails
    its names after GRADFLOW_TIMEOUT (caught), the job is not aborted, and
    the global allreduce then completes (numpy)."""
    proc = run_mpi(n, "cross_engine_wait_script.py", "setfirst", timeout=120, env=SHORT)
    for r in range(n):
        assert f"rank {r}: setfirst OK" in proc.stdout, proc.stdout


@pytest.mark.parametrize("case", ["progress", "straggler"])
@pytest.mark.parametrize("n", [3, 4])
def test_no_false_alarm(case, n):
    """Every rank waits for 1.6 x the timeout, but another engine moves
    ("progress") or a rank computes ("straggler"): nothing may fail."""
    proc = run_mpi(n, "cross_engine_wait_script.py", case, timeout=120, env=SHORT)
    for r in range(n):
        assert f"rank {r}: {case} OK" in proc.stdout, proc.stdout
