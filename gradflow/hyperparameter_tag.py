# gradflow/hyperparameter_tag.py — the text of the hyperparameter check's step tag,
# shared by the torch (gradflow/torch/hyperparameter_check.py) and Keras
# (gradflow/keras/hyperparameter_check.py) optimizer wrappers.
"""Both wrappers fold their optimizer's current hyperparameters into a
running CRC on every reduction round and, every `CHECK_EVERY`-th round, tag
the round's allreduces with ``hyperparameters #<crc> now <values>`` (native
Note [Step tags]): ranks whose tags differ fail the job at once, naming both.
What the values are (param groups, Keras attributes) is the wrapper's; the
text is made here, so the two frameworks' tags read alike and the core's
message fits both.

`values` is a list of groups, each a list of (key, value) pairs whose values
are already plain (floats, bools, None, strings, tuples of those): their
repr is the same text on every rank for equal values (no hash(), whose value
for None differs between processes).
"""
from __future__ import annotations

import numbers
import zlib
from typing import Any, Callable, Sequence, Tuple

import numpy as np

CHECK_EVERY = 16
_DESCRIBE_CHARS = 240  # the tag travels in every request of a tagged round

Values = Sequence[Sequence[Tuple[str, Any]]]


def plain(v: Any, other: Callable[[Any], Any]) -> Any:
    """The value as it acts: a number as a float (1, 1.0 and numpy's
    float64(1) are the same learning rate, and their reprs differ), a bool
    as a bool, a tuple or list item by item; any other kind of value as the
    framework's `other` makes it (a tensor, a variable)."""
    t = type(v)
    if t is float or t is bool or v is None:  # the usual case, first (it runs every step)
        return v
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, str):
        return v
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, (tuple, list)):
        return tuple(plain(x, other) for x in v)
    return other(v)


def fold(crc: int, values: Values) -> int:
    """`crc` updated with `values`."""
    return zlib.crc32(repr(values).encode("utf-8"), crc)


def describe(values: Values, head: Sequence[Tuple[str, Any]] = (),
             head_name: str = "") -> str:
    """'group 0: lr=0.1, momentum=0.9; group 1: ...', cut to a bounded length.
    `head` (values outside the param groups, e.g. torch's GradScaler) comes
    first as '<head_name>: k=v, ...; ', so the cut never hides it."""
    parts = [f"{head_name}: " + ", ".join(f"{k}={v!r}" for k, v in head)] if head else []
    parts += [f"group {g}: " + ", ".join(f"{k}={v!r}" for k, v in items)
              for g, items in enumerate(values)]
    text = "; ".join(parts)
    return text if len(text) <= _DESCRIBE_CHARS else text[:_DESCRIBE_CHARS - 3] + "..."


def tag(crc: int, values: Values, head: Sequence[Tuple[str, Any]] = (),
        head_name: str = "") -> str:
    """The step tag of a check round."""
    return f"hyperparameters #{crc:08x} now {describe(values, head, head_name)}"


def is_check_round(rounds: int) -> bool:
    """Whether the `rounds`-th round since the count restarted carries the tag."""
    return rounds % CHECK_EVERY == 0


def combine(step_tag: str, round_tag: str) -> str:
    """One step tag of two checks (native Note [Step tags]: " & " joins
    them; the first part that differs decides the core's wording)."""
    if not round_tag:
        return step_tag
    return f"{step_tag} & {round_tag}" if step_tag else round_tag
