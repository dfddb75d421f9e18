"""End-to-end `gradflowrun --monitor 1` on 2 and 3 ranks: a ~4 s torch
training job (monitor_script.py, checked against numpy there, ranks bitwise
identical) must get live status lines on the launcher's stderr whose numbers
agree with what the job did: steps/s above 0 and below the script's
sleep-bound ceiling, MB/s sent equal to (bytes per step) x (steps/s) x ranks,
communication share within 0-100 %, a real rank named slowest."""

import json
import os
import re
import subprocess
import sys

import pytest

from _launch import ROOT, rank_env, run_cwd

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitor_script.py")
TIMEOUT = 300
LINE = re.compile(r"gradflowrun: monitor: (\S+) steps/s \| (\S+) MB/s sent \| comm (\d+)% \| "
                  r"slowest rank (\d+) \((\S+) steps/s(?:, \S+ s/step)?, (\d+) steps\)")


@pytest.mark.parametrize("np_", [2, 3])
def test_monitor_prints_live_status_lines(np_):
    r = subprocess.run([sys.executable, "-m", "gradflow.runner.launch", "--monitor", "1",
                        "-np", str(np_), sys.executable, SCRIPT],
                       cwd=run_cwd(), env=rank_env(), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(next(line.split("RESULT ", 1)[1] for line in r.stdout.splitlines()
                             if "RESULT " in line))
    lines = [line for line in r.stderr.splitlines() if "monitor:" in line]
    # The first four fields; "silent: ..." / "k/N ranks reporting" may follow.
    parsed = [LINE.fullmatch(" | ".join(line.split(" | ")[:4])) for line in lines]
    assert all(line.startswith("gradflowrun: monitor: ") for line in lines), lines  # no [r] prefix
    assert all(parsed), lines
    stepping = [m for m in parsed if float(m.group(1)) > 0]
    assert len(stepping) >= 2, r.stderr
    assert any(int(m.group(6)) > 0 for m in stepping), r.stderr
    # Each step sleeps SLEEP s, so no interval can run faster than 1/SLEEP steps/s
    # (+1 step of slack: a step may straddle the interval's edge).
    ceiling = 1.0 / 0.025 + 1.0
    bytes_per_step = result["bytes_sent"] / result["steps"]  # rank 0; a ring is symmetric
    assert bytes_per_step > 0
    for m in stepping:
        steps_per_s, mb_per_s = float(m.group(1)), float(m.group(2))
        assert 0 < steps_per_s <= ceiling, m.group(0)
        assert 0 <= int(m.group(3)) <= 100 and 0 <= int(m.group(4)) < np_, m.group(0)
        # The slowest rank may not have stepped yet (ranks snapshot at their own times).
        assert 0 <= int(m.group(6)) <= result["steps"], m.group(0)
        if steps_per_s >= 5:  # bytes and steps may split at an interval edge: ~1 step of slack
            expected = bytes_per_step * steps_per_s * np_ / 1e6
            assert abs(mb_per_s - expected) <= 0.25 * expected, (m.group(0), expected)
