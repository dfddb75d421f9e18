# gradflow/horovod_compat/env.py — the one table from Horovod's HOROVOD_*
# runtime settings to gradflow's GRADFLOW_* ones, used in compatibility mode.
# Horovod's names: horovod/common/common.h and runner/common/util/config_parser.py
# (0.28.1); gradflow's: native/config.cc. Values are passed through unchanged
# where the units agree (checked per row below); the core validates them.
"""HOROVOD_* -> GRADFLOW_* settings for Horovod compatibility mode.

A GRADFLOW_* variable that is already set wins over its HOROVOD_* twin.
HOROVOD_* variables with no gradflow equivalent are reported as ignored."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, MutableMapping, Optional, Tuple

_TRUE = ("1", "true", "yes", "on")
# Bookkeeping: the GRADFLOW_* names apply() itself wrote, comma-separated.
WRITTEN_ENV = "GRADFLOW_HOROVOD_COMPAT_SET"


def _same(value: str) -> Optional[str]:
    return value


def _lower(value: str) -> Optional[str]:
    return value.strip().lower()


def _flag(value: str) -> Optional[str]:
    # Horovod's SetBoolFromEnv: a value is true when it is "1" (strtol != 0);
    # accept the usual spellings too.
    return "1" if value.strip().lower() in _TRUE else "0"


def _stall_disable(value: str) -> Optional[str]:
    # HOROVOD_STALL_CHECK_DISABLE=1 turns the stall warning off: gradflow's
    # GRADFLOW_STALL_CHECK_TIME=0. A false value sets nothing.
    return "0" if value.strip().lower() in _TRUE else None


def _timeline(value: str) -> Optional[str]:
    # HOROVOD_TIMELINE=DYNAMIC means "start later with hvd.start_timeline()";
    # gradflow has no such mode, so it maps to nothing (reported as ignored).
    return None if value.strip().upper() == "DYNAMIC" else value


# Horovod name -> (gradflow name, conversion, why the units agree).
# Listed in the order they are applied; a later row for the same GRADFLOW
# name overrides an earlier one (HOROVOD_STALL_CHECK_DISABLE beats the time).
HOROVOD_TO_GRADFLOW: Dict[str, Tuple[str, Callable[[str], Optional[str]], str]] = {
    "HOROVOD_FUSION_THRESHOLD": ("GRADFLOW_FUSION_THRESHOLD", _same, "bytes in both"),
    "HOROVOD_CYCLE_TIME": ("GRADFLOW_CYCLE_TIME", _same, "milliseconds in both"),
    "HOROVOD_CACHE_CAPACITY": ("GRADFLOW_CACHE_CAPACITY", _same, "entries in both; 0 = off"),
    "HOROVOD_TIMELINE": ("GRADFLOW_TIMELINE", _timeline, "file path (not DYNAMIC)"),
    "HOROVOD_TIMELINE_MARK_CYCLES": ("GRADFLOW_TIMELINE_MARK_CYCLES", _flag, "boolean"),
    "HOROVOD_LOG_LEVEL": ("GRADFLOW_LOG_LEVEL", _lower, "trace..fatal, any case"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("GRADFLOW_STALL_CHECK_TIME", _same, "seconds in both"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("GRADFLOW_STALL_SHUTDOWN_TIME", _same,
                                            "seconds in both; 0 = off"),
    "HOROVOD_STALL_CHECK_DISABLE": ("GRADFLOW_STALL_CHECK_TIME", _stall_disable,
                                    "1 = no stall warning = GRADFLOW_STALL_CHECK_TIME=0"),
    "HOROVOD_AUTOTUNE": ("GRADFLOW_AUTOTUNE", _flag, "boolean"),
    "HOROVOD_AUTOTUNE_LOG": ("GRADFLOW_AUTOTUNE_LOG", _same, "file path (CSV)"),
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": ("GRADFLOW_AUTOTUNE_WARMUP_SAMPLES", _same,
                                        "samples in both"),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": ("GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", _same,
                                          "steps in both"),
}


@dataclass
class Report:
    """What apply() did: GRADFLOW name -> HOROVOD name it was set from,
    HOROVOD names overridden by a GRADFLOW name set by the user, and
    HOROVOD names with no gradflow equivalent."""

    mapped: Dict[str, str] = field(default_factory=dict)
    overridden: List[Tuple[str, str]] = field(default_factory=list)
    ignored: List[str] = field(default_factory=list)

    def messages(self) -> List[str]:
        out = [f"{h} is ignored: {g} is set and gradflow's own name wins"
               for h, g in self.overridden]
        if self.ignored:
            out.append("ignored (no gradflow equivalent): " + ", ".join(self.ignored))
        return out


def apply(environ: MutableMapping[str, str] = os.environ) -> Report:
    """Copy HOROVOD_* settings in ``environ`` to their GRADFLOW_* names.

    A GRADFLOW_* name already set to a non-empty value is left alone (gradflow's
    name wins). Must run before the core reads its settings (gradflow.init)."""
    report = Report()
    # Names an earlier apply() wrote (a re-init, or a child process that
    # inherited the environment) are ours, not the user's: map them again.
    ours = set(filter(None, environ.get(WRITTEN_ENV, "").split(",")))
    user_set = {g for g, _, _ in HOROVOD_TO_GRADFLOW.values() if environ.get(g) and g not in ours}
    for hname, (gname, convert, _why) in HOROVOD_TO_GRADFLOW.items():
        if hname not in environ:
            continue
        if gname in user_set:
            report.overridden.append((hname, gname))
            continue
        value = convert(environ[hname])
        if value is None:
            if hname != "HOROVOD_STALL_CHECK_DISABLE":  # "0" there is a valid no-op
                report.ignored.append(hname)
            continue
        environ[gname] = value
        report.mapped[gname] = hname
        ours.add(gname)
    if ours:
        environ[WRITTEN_ENV] = ",".join(sorted(ours))
    report.ignored += sorted(n for n in environ
                             if n.startswith("HOROVOD_") and n not in HOROVOD_TO_GRADFLOW)
    return report
