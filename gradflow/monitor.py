# gradflow/monitor.py — the rank side of `gradflowrun --monitor`: counts
# training steps (the optimizer wrappers call count_step) and, only when the
# launcher asked for it, writes a small JSON snapshot of this rank's recent
# rates into the launcher's status dir from a daemon thread. The launcher
# side (reading and printing) is gradflow/runner/monitor_line.py.
"""Live monitoring snapshots for ``gradflowrun --monitor``.

A "step" is one optimizer update: ``gradflow.torch.DistributedOptimizer.step``,
one gradient reduction of ``gradflow.keras.DistributedOptimizer`` or
``gradflow.tensorflow.DistributedGradientTape``. Nothing here runs unless
gradflowrun set ``GRADFLOWRUN_MONITOR_DIR``; then every
``GRADFLOWRUN_MONITOR_INTERVAL`` seconds this rank replaces
``<dir>/rank.<rank>.monitor`` with its steps and per-second rates over the
last interval (from gradflow.stats_scalars.StatsDelta). A failure in the
thread is reported once and stops monitoring; training never sees it.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict, Optional

from .runner.monitor_line import DEFAULT_INTERVAL, DIR_ENV, FILE_SUFFIX, INTERVAL_ENV

# Optimizer updates in this process. No lock: the wrappers call count_step on
# the training thread; an increment lost to a rare race only blurs a rate.
_steps = 0
_thread: Optional[threading.Thread] = None


def count_step() -> None:
    """Count one optimizer update (called by the framework wrappers; cheap)."""
    global _steps
    _steps += 1


def running() -> bool:
    """Whether this process writes monitoring snapshots (gradflowrun
    --monitor): a wrapper that adds per-step work only to count steps
    (the one-rank TensorFlow path) checks this first."""
    return _thread is not None


def steps() -> int:
    """Optimizer updates counted in this process so far."""
    return _steps


def snapshot(delta: Any, steps_now: int, steps_before: int, rank: int) -> Dict[str, Any]:
    """One rank's snapshot: totals plus rates over the interval since the
    previous call of ``delta.take`` (a StatsDelta; this call advances it)."""
    done = steps_now - steps_before
    # take() gives per-step values; with no step in the interval, take(1)
    # still moves the baseline and its step_seconds is the interval's wall time.
    per = max(done, 1)
    s = delta.take(per)
    p = delta.prefix
    wall = s[p + "step_seconds"] * per
    sent = s[p + "bytes_sent_per_step"] * per
    return {
        "rank": rank, "time": time.time(), "steps": steps_now,
        "interval_s": wall,
        "steps_per_s": done / wall if wall > 0 else 0.0,
        # max(0): reset_stats() in the interval makes the difference negative.
        "bytes_sent_per_s": max(0.0, sent / wall) if wall > 0 else 0.0,
        "comm_fraction": max(0.0, s[p + "comm_fraction"]),
        "step_seconds": wall / done if done else None,
    }


def write_snapshot(directory: str, data: Dict[str, Any]) -> None:
    """Atomically replace ``directory/rank.<rank>.monitor`` (temp + rename),
    so the launcher never reads half a file."""
    path = os.path.join(directory, f"rank.{data['rank']}.{FILE_SUFFIX}")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def start_if_asked(rank: int) -> None:
    """Start the snapshot thread when gradflowrun asked for monitoring and
    its status dir is visible here (not on other hosts without a shared
    filesystem). Called by gradflow.init(); a second init keeps the thread."""
    global _thread
    directory = os.environ.get(DIR_ENV, "")
    if not directory or _thread is not None or not os.path.isdir(directory):
        return
    try:
        interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        interval = DEFAULT_INTERVAL
    interval = max(interval, 0.1)
    _thread = threading.Thread(target=_run, args=(directory, interval, rank),
                               name="gradflow-monitor", daemon=True)
    _thread.start()


def _run(directory: str, interval: float, rank: int) -> None:
    from . import _native  # noqa: PLC0415 - imported by gradflow already
    from .stats_scalars import StatsDelta  # noqa: PLC0415
    try:
        delta = StatsDelta()
        before = _steps
        while True:
            time.sleep(interval)
            if not _native.is_initialized():
                continue  # after shutdown(): stats are gone; a later init resumes
            now = _steps
            write_snapshot(directory, snapshot(delta, now, before, rank))
            before = now
    except Exception as e:  # monitoring must never break training: warn once, stop
        try:
            sys.stderr.write(f"gradflow: monitoring stopped on rank {rank}: "
                             f"{type(e).__name__}: {e}\n")
        except Exception:
            pass
