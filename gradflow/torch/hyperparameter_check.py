# hyperparameter_check.py — catches ranks that train with different optimizer
# hyperparameters (learning rate, momentum, weight decay, ...).
"""Every rank applies the same averaged gradient, so the ranks' weights stay
identical only if every rank's optimizer uses the same hyperparameters.
Nothing in data-parallel training enforces that: ``ReduceLROnPlateau``
stepped on each rank's own validation loss, or a scheduler restored on rank 0
only, gives the ranks different learning rates, and their weights drift
apart silently (under DDP and Horovod too).

Each ``step()`` of a wrapped optimizer folds the standard hyperparameters
of every param group into a running CRC (a few microseconds: the values
packed as doubles), so a difference that lasted a single step is still
seen. Every ``CHECK_EVERY`` steps it submits one int64 Sum allreduce of
``[1, h, h*h]`` (``h``: 20 bits of the running CRC), and the next
``step()`` waits for it before its own update (it has long completed by
then). The hashes were equal on every contributing rank iff
``S1**2 == c * S2`` (equality in Cauchy-Schwarz); ranks that called
``join()`` contribute zeros and are not counted (``c``). On a mismatch every
rank raises ``GradflowError`` naming its own current values.

Alignment: the check goes out on the same step on every rank because every
rank runs ``step()`` equally often (a step skipped by a GradScaler is skipped
on every rank: the reduced gradients carry the inf); the count restarts with
the optimizer and after an elastic reset (``reset``), on newcomers and old
workers alike. Only the keys below are hashed: a key a user keeps in a param
group for their own purposes may legitimately differ.
"""
from __future__ import annotations

import zlib
from array import array
from typing import Any, Iterable, List

import torch

from .._runtime import GradflowError
from ..collectives import Sum
from .ops import allreduce_async, synchronize

CHECK_EVERY = 16
# The hyperparameters of torch.optim's optimizers.
KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "betas", "eps", "amsgrad",
        "maximize", "alpha", "centered", "lr_decay", "initial_accumulator_value", "rho",
        "lambd", "t0", "etas", "step_sizes", "momentum_decay", "decoupled_weight_decay")


def _value(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, (tuple, list)):
        return tuple(_value(x) for x in v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    return None  # not a plain value: not compared


def _flat(v: Any, out: List[float]) -> None:
    """Append `v` (from _value) as doubles; None and bools get codes of their own."""
    if isinstance(v, tuple):
        out.append(float(len(v)))
        for x in v:
            _flat(x, out)
    elif v is None:
        out.append(-1.5e300)
    elif isinstance(v, bool):
        out.append(2.5e300 if v else -2.5e300)
    else:
        out.append(v)


def fold(crc: int, param_groups: Iterable[dict]) -> int:
    """`crc` updated with this step's hyperparameters (deterministic across
    processes: no string or object hashes)."""
    values: List[float] = []
    for group in param_groups:
        values.append(7.5e300)  # group separator
        for k in KEYS:
            if k in group:
                _flat(_value(group[k]), values)
    return zlib.crc32(array("d", values).tobytes(), crc)


def describe(param_groups: Iterable[dict]) -> str:
    """'group 0: lr=0.1, momentum=0.9; group 1: ...' (the hashed text)."""
    parts: List[str] = []
    for g, group in enumerate(param_groups):
        items = [f"{k}={_value(group[k])!r}" for k in KEYS if k in group]
        parts.append(f"group {g}: " + ", ".join(items))
    return "; ".join(parts)


def reset(s) -> None:
    """A new optimizer or a new runtime (elastic reset): start counting again."""
    s.hyper_steps = 0
    s.hyper_crc = 0
    s.hyper_pending = None


def on_step(s, param_groups: List[dict]) -> None:
    """Called by step() on every rank before the wrapped update: check the
    previous submission, then fold this step in and submit every
    CHECK_EVERY steps."""
    pending, s.hyper_pending = s.hyper_pending, None
    if pending is not None:
        count, total, squares = (int(v) for v in synchronize(pending).tolist())
        if total * total != count * squares:
            raise GradflowError(
                f"gradflow: {s.prefix}: the ranks' optimizer hyperparameters differed in some "
                f"step (compared every {CHECK_EVERY} steps, over every step so far); this "
                f"rank's are now {{{describe(param_groups)}}}. Ranks that update with different "
                "learning rates, momentum or weight decay end with different weights. Usual "
                "causes: an LR scheduler stepped on a rank-local value (ReduceLROnPlateau on "
                "each rank's own validation loss: average it first, e.g. with "
                "gradflow.torch.allreduce), or a scheduler or optimizer state restored on some "
                "ranks only (restore it everywhere, or use broadcast_optimizer_state / "
                "broadcast_object)")
    if s.solo:
        return
    s.hyper_crc = fold(s.hyper_crc, param_groups)
    s.hyper_steps += 1
    if s.hyper_steps % CHECK_EVERY != 1:
        return
    h = s.hyper_crc & 0xFFFFF
    t = torch.tensor([1, h, h * h], dtype=torch.int64)
    s.hyper_pending = allreduce_async(t, op=Sum, name=f"{s.prefix}.hyperparameters",
                                      process_set=s.process_set, sparse_ratio=1.0)
