# gradflow/settings_check.py — checks of the settings Python handles: keyword
# arguments that set a GRADFLOW_* value for one optimizer or call
# (sparse_ratio=, bucket_mb=), and the GRADFLOW_* variables only Python reads
# (GRADFLOW_TF_OVERLAP). Framework-free, so init() and every binding share it.
"""A keyword such as `sparse_ratio=` has the meaning of its GRADFLOW_*
variable (README, "Configuration and tuning"), so it gets the same limits
and the same kind of error. The limits are not copied here: the value is
handed to the core's own parser (`_native.validate_config`, native/config.cc
kKeys), the one that rejects the environment variable at init(). Before,
the Python checks had limits of their own: `bucket_mb=0.001` (1048 bytes)
or `sparse_ratio=1e-9` passed although GRADFLOW_POOL_BUCKET_BYTES and
GRADFLOW_SPARSE_RATIO refuse them, and `bucket_mb=0` / `-1` silently meant
the default.

Errors are `GradflowValueError` (a `ValueError` and a `GradflowError`), raised
on the rank that passed the value before anything is communicated; the same
code on every rank makes every rank raise alike.
"""
from __future__ import annotations

import math
import numbers
import os
import re
from typing import Any, Dict, Mapping, Optional, Set, Tuple

from . import _native

GradflowValueError = _native.GradflowValueError

SPARSE_RATIO_ENV = "GRADFLOW_SPARSE_RATIO"
POOL_BUCKET_ENV = "GRADFLOW_POOL_BUCKET_BYTES"
MIB = 1 << 20

# Values the core accepted, per variable: allreduce checks its sparse_ratio on
# every call, and a set lookup costs less than building the override map.
_accepted: Set[Tuple[str, str]] = set()
_ACCEPTED_MAX = 4096
_keys: Optional[Dict[str, dict]] = None


def _config_keys() -> Dict[str, dict]:
    global _keys
    if _keys is None:
        _keys = {k["env"]: k for k in _native.config_keys()}
    return _keys


def _core_rejects(env: str, text: str) -> Optional[str]:
    """The core's message if it refuses `text` for `env`, else None. Every
    other setting is passed at its default so that the environment (checked
    at init(), possibly changed since) can neither fail the check nor be
    named in its message."""
    if (env, text) in _accepted:
        return None
    overrides = {name: key["default"] for name, key in _config_keys().items()}
    overrides[env] = text
    try:
        _native.validate_config(overrides)
    except _native.GradflowError as e:
        return str(e)
    if len(_accepted) < _ACCEPTED_MAX:
        _accepted.add((env, text))
    return None


def _reject(what: str, keyword: str, value: Any, unit_note: str, why: str, accepted: str,
            env: str, in_mib: bool) -> None:
    scale = ", in MiB" if in_mib else ""
    raise GradflowValueError(
        f"gradflow: {what}: invalid {keyword}={value!r}{unit_note}: {why}. Accepted: None (the "
        f"{env} setting) or {accepted} ({keyword}= sets {env}{scale} for this {what} only)")


def check_keyword(value: Any, keyword: str, env: str, what: str, scale: float = 1.0
                  ) -> Optional[float]:
    """`value` of keyword `keyword` (None: the `env` setting applies) checked
    against the core's limits for `env`; returns it in `env`'s unit (times
    `scale`; truncated to an int for integer settings), or None. A bool, a
    string or anything else that is not a real number is refused too."""
    if value is None:
        return None
    key = _config_keys()[env]
    integer = key["type"] == "int"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _reject(what, keyword, value, "", f"not a number ({type(value).__name__})", key["help"],
                env, scale != 1.0)
    number = float(value) * scale
    unit_note = ""
    if not math.isfinite(number):
        text = repr(float(value))  # the core's "not a number"
    elif integer:
        number = int(number)  # bucket_mb * 2**20: what the pool is given
        text = str(number)
        unit_note = f" ({number} bytes)" if scale == MIB else f" ({number})"
    else:
        text = repr(number)
    message = _core_rejects(env, text)
    if message is not None:
        # "gradflow: invalid value 'V' for ENV (FLAG): WHY. Accepted: HELP"
        m = re.search(r"\): (.*?)\. Accepted: (.*)$", message, re.S)
        why, accepted = m.groups() if m else (message, key["help"])
        _reject(what, keyword, value, unit_note, why, accepted, env, scale == MIB)
    return number


def native_sparse_ratio(sparse_ratio: Any, what: str) -> float:
    """A `sparse_ratio=` keyword checked as GRADFLOW_SPARSE_RATIO is (the
    core's range, 1e-6 <= value <= 1), in the core's encoding: -1.0 for
    None (the setting applies)."""
    ratio = check_keyword(sparse_ratio, "sparse_ratio", SPARSE_RATIO_ENV, what)
    return -1.0 if ratio is None else ratio


def pool_bucket_bytes(bucket_mb: Any, what: str) -> int:
    """A `bucket_mb=` keyword (MiB) checked as GRADFLOW_POOL_BUCKET_BYTES is
    (at least 4096 bytes), in bytes; -1 for None (the setting applies)."""
    size = check_keyword(bucket_mb, "bucket_mb", POOL_BUCKET_ENV, what, scale=MIB)
    return -1 if size is None else int(size)


# ---------------------------------------------------------------- GRADFLOW_* read by Python

TF_OVERLAP_ENV = "GRADFLOW_TF_OVERLAP"
_TRUE = ("1", "true", "yes", "on", "")  # unset or empty: the default, on
_FALSE = ("0", "false", "no", "off")
_TF_OVERLAP_HELP = ("1 | 0 (also true/false, yes/no, on/off, any case; empty = 1): TensorFlow/"
                    "Keras gradient allreduces inside tf.function start during backward (1) or "
                    "cross once after it (0)")


def tf_overlap_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """GRADFLOW_TF_OVERLAP: whether graph-mode TensorFlow/Keras gradient
    reduction overlaps with backward. GradflowValueError, worded as the
    core's rejections, for anything but the accepted values."""
    raw = environ.get(TF_OVERLAP_ENV, "1")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise GradflowValueError(f"gradflow: invalid value '{raw}' for {TF_OVERLAP_ENV} (environment "
                             f"only): not a boolean. Accepted: {_TF_OVERLAP_HELP}")


def check_python_settings(environ: Mapping[str, str] = os.environ) -> None:
    """Reject, at init(), an invalid GRADFLOW_* variable that only Python
    reads, as the core rejects its own there: TensorFlow reads
    GRADFLOW_TF_OVERLAP only when a step is traced, which may be long after
    start (or never, for a program not using TensorFlow; a typo is still an
    error, as for every other setting)."""
    tf_overlap_enabled(environ)
