"""Which hosts an elastic job may use: a static -H/--hostfile list or
Horovod's --host-discovery-script (run every second; prints `host:slots`
lines, or `host` with --slots-per-host), minus blacklisted hosts.

A host the script stops listing is dropped only when the next run (a
second later) does not list it either: one answer caught mid-rewrite of
the file the script prints (read empty, or cut short), or one glitch of a
cluster's API, would otherwise dismiss the workers there, and with them,
if they were all, the training state (Note [A host removal is confirmed]).

A host where a worker failed is blacklisted: for ever without
--blacklist-cooldown-range, else for a cooldown that starts at LOW seconds
and doubles with each further failure there, capped at HIGH (a host that
keeps failing stays out longer), as Horovod's cooldown does.
"""
from __future__ import annotations

import math
import subprocess
import time
from typing import Dict, Optional, Sequence, Tuple

try:
    from . import hosts as _hosts
except ImportError:  # run as a script
    import hosts as _hosts  # type: ignore[no-redef]

DISCOVERY_TIMEOUT = 10.0  # seconds one run of the discovery script may take


def parse_discovery_output(text: str, slots_per_host: Optional[int]) -> Dict[str, int]:
    """host -> slots from a discovery script's output (Horovod's contract).
    Raises ValueError naming the bad line."""
    found: Dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, slots = line.partition(":")
        where = f"host discovery script, line {n} ({line!r})"
        _hosts.check_host_name(name.strip(), where)
        if sep:
            count = _hosts._parse_slots(slots.strip(), where)
        elif slots_per_host:
            count = slots_per_host
        else:
            raise ValueError(f"{where}: no slot count; print host:slots or pass --slots-per-host")
        found[name.strip()] = count
    return found


class HostManager:
    """The hosts the job may use now, with blacklisting."""

    def __init__(self, static: Optional[Dict[str, int]] = None,
                 discovery_script: Optional[str] = None, slots_per_host: Optional[int] = None,
                 cooldown_range: Optional[Tuple[float, float]] = None):
        if (static is None) == (discovery_script is None):
            raise ValueError("give either hosts (-H/--hostfile) or --host-discovery-script")
        self.static, self.script = static, discovery_script
        self.slots_per_host, self.cooldown = slots_per_host, cooldown_range
        self.known: Dict[str, int] = dict(static or {})
        self.unconfirmed: Dict[str, int] = {}  # known hosts the last run did not list
        self.failures: Dict[str, int] = {}
        self.blacklisted_until: Dict[str, float] = {}
        self.last_error = ""

    def discover(self) -> Dict[str, int]:
        """Run the discovery script (if any) and return host -> slots as it
        says now, except that a host it stopped listing stays until a second
        run in a row leaves it out. A failing or hanging script keeps the
        last answer."""
        if self.script is None:
            return dict(self.known)
        try:
            r = subprocess.run(self.script, shell=True, capture_output=True, text=True,
                               timeout=DISCOVERY_TIMEOUT)
            if r.returncode != 0:
                raise ValueError(f"exited with code {r.returncode}: {r.stderr.strip()[:200]}")
            found = parse_discovery_output(r.stdout, self.slots_per_host)
            # Note [A host removal is confirmed]: a host missing for the
            # first time keeps its last slot count for one more run (removals
            # take DISCOVERY_INTERVAL longer). Before, one empty read of a
            # host file rewritten in place (test_elastic's grow(), a suspect
            # of its flake; reproduced by holding the file empty) dismissed
            # the only worker, all of the state, and a fresh one trained
            # from the start: the job "succeeded" having lost its progress.
            missing = {h: n for h, n in self.known.items() if h not in found}
            self.known = dict(found)
            self.known.update({h: n for h, n in missing.items() if h not in self.unconfirmed})
            self.unconfirmed = missing
            self.last_error = ""
        except (ValueError, subprocess.TimeoutExpired, OSError) as e:
            self.last_error = f"host discovery script {self.script!r} failed: {e}"
        return dict(self.known)

    def usable(self, now: Optional[float] = None) -> Dict[str, int]:
        """Known hosts that are not blacklisted now."""
        now = time.monotonic() if now is None else now
        return {h: s for h, s in self.known.items() if self.blacklisted_until.get(h, 0) <= now}

    def blacklist(self, host: str, now: Optional[float] = None) -> float:
        """Record a failure on `host`; returns how long it stays out (inf: for ever)."""
        now = time.monotonic() if now is None else now
        n = self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown is None:
            delay = math.inf
        else:
            low, high = self.cooldown
            delay = min(high, low * 2 ** (n - 1))
        self.blacklisted_until[host] = now + delay
        return delay

    def is_blacklisted(self, host: str, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.blacklisted_until.get(host, 0) > now


def parse_cooldown(values: Optional[Sequence[float]]) -> Optional[Tuple[float, float]]:
    """--blacklist-cooldown-range LOW HIGH -> (low, high), checked."""
    if values is None:
        return None
    low, high = float(values[0]), float(values[1])
    if not 0 < low <= high:
        raise ValueError(f"--blacklist-cooldown-range needs 0 < LOW <= HIGH, got {low:g} {high:g}")
    return low, high
