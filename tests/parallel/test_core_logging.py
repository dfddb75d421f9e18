"""GRADFLOW_LOG_LEVEL (gradflowrun --log-level, any case, as horovodrun's)
is used by the core: INFO says when a rank started, DEBUG logs each cycle
that runs collectives on every rank, TRACE each response; the default
(warning) prints none of these. The collectives' results are checked too."""
import os
import subprocess
import sys

import pytest

from _launch import HERE, rank_env, run_cwd

TIMEOUT = 180


def run(n, *flags):
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "-np", str(n), *flags, sys.executable,
           os.path.join(HERE, "log_level_script.py")]
    env = rank_env()
    env.pop("GRADFLOW_LOG_LEVEL", None)
    proc = subprocess.run(cmd, cwd=run_cwd(), env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("log level OK") == n, proc.stdout
    return proc.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_default_level_is_quiet(n):
    err = run(n)
    assert "] INFO:" not in err and "] DEBUG:" not in err and "] TRACE:" not in err, err


@pytest.mark.parametrize("n", [2, 3])
def test_debug_logs_cycles_on_every_rank(n):
    err = run(n, "--log-level", "DEBUG")
    for r in range(n):
        assert f"[gradflow rank {r}] INFO: started: rank {r} of {n}, log level debug" in err
        assert f"[gradflow rank {r}] DEBUG: cycle 1: " in err, err
    assert "] TRACE:" not in err


@pytest.mark.parametrize("n", [2, 3])
def test_trace_logs_each_response(n):
    err = run(n, "--log-level", "trace")
    for r in range(n):
        for step in range(3):
            assert f"[gradflow rank {r}] TRACE:   allreduce 'logged.{step}'" in err, err
    if n >= 3:
        # The set {1, ..., n-1}'s engine numbers its members from 0; each
        # process's lines still carry its global rank (gradflowrun's "[r]"
        # prefix says which process wrote the line).
        for r in range(n):
            line = f"[{r}]<stderr>: [gradflow rank {r}] TRACE:   allreduce 'in.set.logged'"
            assert (line in err) == (r >= 1), err


def test_error_level_hides_info():
    err = run(2, "--log-level", "Error")
    assert "] INFO:" not in err and "] DEBUG:" not in err
