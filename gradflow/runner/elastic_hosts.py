"""Which hosts an elastic job may use: a static -H/--hostfile list or
Horovod's --host-discovery-script (run every second; prints `host:slots`
lines, or `host` with --slots-per-host), minus blacklisted hosts.

What one answer takes away (a host it stops listing, slots it lowers)
counts only when the next run (a second later) says so too; what it adds
counts at once, unless its output does not end with a newline (it may be
cut inside its last line, `host-10` read as `host-1`): then also only
when the next run agrees (Note [A host removal is confirmed]).

A host where a worker failed is blacklisted: for ever without
--blacklist-cooldown-range, else for a cooldown that starts at LOW seconds
and doubles with each further failure there, capped at HIGH (a host that
keeps failing stays out longer), as Horovod's cooldown does.
"""
from __future__ import annotations

import math
import os
import signal
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


def run_script(script: str, timeout: float) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of `script` run by the shell; ValueError
    once it runs past `timeout`, after killing its whole process group:
    subprocess.run's timeout kills only the shell, and what the shell was
    waiting for (`sleep 30` in `echo a:1; sleep 30`, a hung API call) went on
    running, one orphan per hung run, every DISCOVERY_TIMEOUT +
    DISCOVERY_INTERVAL seconds for as long as the script hangs (2026-11-29)."""
    proc = subprocess.Popen(script, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise ValueError(f"still running after {timeout:g} s (killed)") from None
    return proc.returncode, out, err


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
        self.last_answer: Optional[Dict[str, int]] = None  # the last run's own answer
        self.failures: Dict[str, int] = {}
        self.blacklisted_until: Dict[str, float] = {}
        self.last_error = ""

    def discover(self) -> Dict[str, int]:
        """Run the discovery script (if any) and return host -> slots as
        it says now, except for changes a cut answer could fake, which wait
        for the next run (confirm()). A failing or hanging script keeps the
        last answer."""
        if self.script is None:
            return dict(self.known)
        try:
            code, out, err = run_script(self.script, DISCOVERY_TIMEOUT)
            if code != 0:
                raise ValueError(f"exited with code {code}: {err.strip()[:200]}")
            found = parse_discovery_output(out, self.slots_per_host)
            whole = out == "" or out.endswith("\n")
            self.known = confirm(self.known, found, self.last_answer, whole)
            self.last_answer = found
            self.last_error = ""
        except (ValueError, OSError) as e:
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


# Note [A host removal is confirmed]: the discovery script often `cat`s a
# host file that another program rewrites in place; a run that reads it
# mid-rewrite gets it cut short: empty, short of lines, or cut inside a line
# (`localhost:12` read as `localhost:1`; `host-10:2` as `host-10:` (an
# error, the last answer stays) or, with --slots-per-host, as `host-1`, a
# host never meant). A cut can only take away, except in its last line,
# which then lacks its newline. So:
# * what an answer takes away (a host missing, fewer slots) counts only
#   when the next answer (DISCOVERY_INTERVAL later) takes it away too (the
#   smaller loss of the two); removals and slot reductions wait 1 s;
# * what it adds (a new host, more slots) counts at once (growth is not
#   delayed), unless the output does not end with a newline: then only
#   what the next answer shows too (a script that never prints a final
#   newline grows 1 s later).
# Before dc5d3ab (2026-11-29) a removal counted at once: one empty read of a host
# file rewritten in place (test_elastic's grow(), a suspect of its flake;
# reproduced by holding the file empty) dismissed the only worker, all of
# the state, and a fresh one trained from the start: the job "succeeded"
# having lost its progress. After it, the other changes still counted at
# once: `localhost:12` read as `localhost:1` lowered the slots (which now
# dismisses the workers beyond them, as Horovod does: elastic_driver.py
# _on_hosts), and `host-10` read as `host-1` started a worker on host-1,
# whose failure blacklisted it for the rest of the job.
def confirm(known: Dict[str, int], found: Dict[str, int],
            previous: Optional[Dict[str, int]], whole: bool) -> Dict[str, int]:
    """The hosts to use after an answer `found` (`whole`: its output ended
    with a newline), given those in use (`known`) and the answer before it
    (`previous`, None for the first one: taken as it is)."""
    out: Dict[str, int] = {}
    for h in list(known) + [h for h in found if h not in known]:
        k, c = known.get(h, 0), found.get(h, 0)
        p = c if previous is None else previous.get(h, 0)
        if c < k:
            n = min(k, max(c, p))      # taken away: as far as both answers agree
        elif c > k and not whole:
            n = max(k, min(c, p))      # added by a maybe-cut answer: what both show
        else:
            n = c
        if n > 0:
            out[h] = n
    return out


def parse_cooldown(values: Optional[Sequence[float]]) -> Optional[Tuple[float, float]]:
    """--blacklist-cooldown-range LOW HIGH -> (low, high), checked."""
    if values is None:
        return None
    low, high = float(values[0]), float(values[1])
    if not 0 < low <= high:
        raise ValueError(f"--blacklist-cooldown-range needs 0 < LOW <= HIGH, got {low:g} {high:g}")
    return low, high
