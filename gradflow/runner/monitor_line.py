"""The launcher side of ``gradflowrun --monitor``: reads the ranks' snapshot
files (written by gradflow/monitor.py into the status dir) and formats the
one-line live status printed to the launcher's stderr. Standard library only
(supervise.py runs it; it must not import gradflow, which starts MPI).

Only ranks on this host are visible (the status dir is local): on a
multi-host job the line covers the local ranks and says how many that is.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Mapping, Optional

# Set by launch.py for --monitor; not GRADFLOW_* so config.cc ignores them.
# gradflow/monitor.py (rank side) imports these names from here.
DIR_ENV = "GRADFLOWRUN_MONITOR_DIR"  # the status dir
INTERVAL_ENV = "GRADFLOWRUN_MONITOR_INTERVAL"  # seconds
FILE_SUFFIX = "monitor"  # gradflow/monitor.py writes <status_dir>/rank.<r>.monitor
DEFAULT_INTERVAL = 5.0
# A snapshot older than this many intervals (plus a second for a busy
# machine) is shown as stale: that rank stopped reporting (stuck or gone).
STALE_INTERVALS = 3.0


def read_snapshots(status_dir: str, np: int) -> Dict[int, Dict[str, Any]]:
    """rank -> its latest snapshot; ranks without a (readable) one are left out."""
    out = {}
    for r in range(np):
        try:
            with open(os.path.join(status_dir, f"rank.{r}.{FILE_SUFFIX}"), encoding="utf-8") as f:
                snap = json.load(f)
            if isinstance(snap, dict):
                out[r] = snap
        except (OSError, ValueError):
            continue
    return out


def _num(snap: Mapping[str, Any], key: str) -> float:
    value = snap.get(key)
    return float(value) if isinstance(value, (int, float)) else 0.0


def format_line(snaps: Mapping[int, Mapping[str, Any]], np: int, interval: float,
                now: Optional[float] = None) -> Optional[str]:
    """The status line for these snapshots, or None when no rank reported yet.

    steps/s is the mean over the reporting ranks (data-parallel ranks step
    together, so they agree unless one lags), MB/s is what all of them sent
    together, comm is the mean share of wall time in communication; the
    slowest rank is the one with the fewest steps/s (ties: fewest steps)."""
    if not snaps:
        return None
    now = time.time() if now is None else now
    ranks = sorted(snaps)
    rate = {r: _num(snaps[r], "steps_per_s") for r in ranks}
    steps_per_s = sum(rate.values()) / len(ranks)
    mb_per_s = sum(_num(snaps[r], "bytes_sent_per_s") for r in ranks) / 1e6
    comm = sum(_num(snaps[r], "comm_fraction") for r in ranks) / len(ranks)
    slow = min(ranks, key=lambda r: (rate[r], _num(snaps[r], "steps"), r))
    step_s = snaps[slow].get("step_seconds")
    slow_text = f"slowest rank {slow} ({rate[slow]:.3g} steps/s"
    if isinstance(step_s, (int, float)):
        slow_text += f", {float(step_s):.3g} s/step"
    slow_text += f", {int(_num(snaps[slow], 'steps'))} steps)"
    parts = [f"gradflowrun: monitor: {steps_per_s:.3g} steps/s",
             f"{mb_per_s:.3g} MB/s sent", f"comm {100.0 * comm:.0f}%", slow_text]
    stale = [r for r in ranks if now - _num(snaps[r], "time") > STALE_INTERVALS * interval + 1.0]
    if stale:
        parts.append("silent: rank " + ", ".join(str(r) for r in stale))
    if len(ranks) < np:
        parts.append(f"{len(ranks)}/{np} ranks reporting (local ranks only)")
    return " | ".join(parts)


class Monitor:
    """Called from supervise.py's poll loop: prints a line every `interval`
    seconds once a rank has reported."""

    def __init__(self, status_dir: str, np: int, interval: float) -> None:
        self.status_dir, self.np, self.interval = status_dir, np, interval
        self.next_at = time.monotonic() + interval

    def poll(self, stream: Any) -> None:
        """Print the line if it is time; never raises (the job matters more)."""
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.interval
        try:
            line = format_line(read_snapshots(self.status_dir, self.np), self.np, self.interval)
            if line:
                print(line, file=stream, flush=True)
        except Exception:  # noqa: BLE001 - a bad snapshot must not stop supervision
            pass
