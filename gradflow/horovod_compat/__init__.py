# gradflow/horovod_compat/__init__.py — Horovod compatibility mode: makes
# `import horovod.torch` (and .tensorflow, .tensorflow.keras, .keras) give
# gradflow's modules, so an unmodified Horovod script runs under gradflow.
# Owns: the on/off switch, the horovod.* -> gradflow.* import finder, the
# detection of a real Horovod it would shadow, and the one notice printed at
# init. The HOROVOD_* -> GRADFLOW_* settings table lives in env.py.
"""Horovod compatibility mode (docs/horovod_compat.md, "Compatibility mode").

Turned on by ``gradflowrun --horovod-compat`` or by ``GRADFLOW_HOROVOD_COMPAT=1``
in the environment of any launcher (``mpiexec``, ``srun``): the directory
``SHIM_DIR`` is then first on ``sys.path`` and holds a tiny ``horovod``
package whose submodules are gradflow's. When the switch is off nothing here
runs and ``import horovod`` behaves as without gradflow.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Dict, List, Mapping, Optional

from . import env as _env

ENV_SWITCH = "GRADFLOW_HOROVOD_COMPAT"
SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
# The Horovod release whose API gradflow follows (what horovod.__version__ says).
HOROVOD_API_VERSION = "0.28.1"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

# horovod.<key>[.<rest>] is gradflow.<value>[.<rest>]. Horovod's
# horovod.keras (standalone Keras 2) and horovod.tensorflow.keras are the same
# module in gradflow (Keras 3 is tf.keras).
_ALIASES = {
    "horovod.torch": "gradflow.torch",
    "horovod.tensorflow": "gradflow.tensorflow",
    "horovod.keras": "gradflow.keras",
}


def is_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether GRADFLOW_HOROVOD_COMPAT asks for compatibility mode.

    Raises ValueError for a value that is neither true (1/true/yes/on) nor
    false (unset/empty/0/false/no/off), so a typo is not silently "off"."""
    value = environ.get(ENV_SWITCH, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{ENV_SWITCH}={environ.get(ENV_SWITCH)!r}: expected 1/true/yes/on "
                     "or 0/false/no/off")


def gradflow_name(fullname: str) -> Optional[str]:
    """The gradflow module behind a horovod.* module name, or None."""
    for prefix, target in _ALIASES.items():
        if fullname == prefix or fullname.startswith(prefix + "."):
            return target + fullname[len(prefix):]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads horovod.X by importing gradflow.X and putting that very module
    object in sys.modules under the horovod name (the import system re-reads
    sys.modules after exec_module), so there is one module, not a copy."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):  # default module; replaced in exec_module
        return None

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Answers every horovod.<sub> import while compatibility mode is on."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        real = gradflow_name(fullname)
        if real is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: gradflow's Horovod compatibility mode provides "
                "horovod.torch, horovod.tensorflow, horovod.tensorflow.keras and horovod.keras "
                "(see docs/horovod_compat.md)", name=fullname)
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} (gradflow has no {real})",
                                      name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


_finder = _AliasFinder()


def install_finder() -> None:
    """Put the horovod.* finder first on sys.meta_path (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def real_horovod_location(path: Optional[List[str]] = None) -> Optional[str]:
    """Where a real Horovod is installed on ``path`` (default sys.path),
    ignoring the shim, or None."""
    shim = os.path.realpath(SHIM_DIR)
    search = [p for p in (sys.path if path is None else path)
              if os.path.realpath(p or os.curdir) != shim]
    spec = importlib.machinery.PathFinder.find_spec("horovod", search)
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or [None])[0]


_state: Dict[str, object] = {"notified": False}  # "report": the last env.apply() Report


def before_init(environ=os.environ) -> Dict[str, str]:
    """Called by gradflow.init before the core reads its settings: when
    compatibility mode is on, copies HOROVOD_* settings to their GRADFLOW_*
    names (env.apply). Returns {GRADFLOW name: HOROVOD name} for what it set."""
    if not is_enabled(environ):
        return {}
    report = _env.apply(environ)
    _state["report"] = report
    return dict(report.mapped)


def reraise_with_origin(error: BaseException, mapped: Mapping[str, str]) -> None:
    """If the core rejected a GRADFLOW_* value that before_init() copied from
    a HOROVOD_* variable, raise the same error type naming the HOROVOD_* one
    (the user never wrote the GRADFLOW_* name); otherwise return."""
    text = str(error)
    for gname, hname in mapped.items():
        if gname in text:
            try:
                new = type(error)(f"{text} (set from {hname} by gradflow's Horovod "
                                  "compatibility mode)")
            except Exception:  # an exception type with another constructor
                return
            raise new from error


def after_init(rank: int, stream=None) -> None:
    """Called by gradflow.init once the core runs: rank 0 says, once per
    process, which HOROVOD_* settings it ignored and whether a real Horovod
    is being shadowed."""
    if _state["notified"] or not is_enabled() or rank != 0:
        return
    _state["notified"] = True
    stream = stream or sys.stderr
    lines = []
    real = real_horovod_location()
    if real:
        lines.append(f"a Horovod installation at {real} is shadowed: `import horovod` gives "
                     "gradflow's modules")
    report = _state.get("report")
    if report is not None:
        lines += report.messages()
    for line in lines:
        print(f"gradflow: Horovod compatibility mode: {line}", file=stream, flush=True)
