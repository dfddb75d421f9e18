# hyperparameter_check.py — catches ranks that train with different optimizer
# hyperparameters (learning rate, momentum, weight decay, ...).
"""Every rank applies the same averaged gradient, so the ranks' weights stay
identical only if every rank's optimizer uses the same hyperparameters.
Nothing in data-parallel training enforces that: ``ReduceLROnPlateau``
stepped on each rank's own validation loss, or a scheduler restored on rank 0
only, gives the ranks different learning rates, and their weights drift
apart silently (under DDP and Horovod too).

Each ``step()`` of a wrapped optimizer folds the standard hyperparameters
of every param group into a running CRC (measured: ~6 µs a step for one
param group, ~3 µs for each further one), so a difference that lasted a
single step is still seen. Every ``CHECK_EVERY`` steps it submits one int64
Sum allreduce of ``[1, h, h*h]`` (``h``: 20 bits of the running CRC), and the next
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
group for their own purposes may legitimately differ. Tensor-valued
hyperparameters (fused or capturable optimizers' tensor lr) are not
compared (see _plain).
"""
from __future__ import annotations

import zlib
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


_KEY_SET = frozenset(KEYS)


def _plain(v: Any) -> Any:
    """A tensor value (a tensor lr or betas: fused or capturable optimizers)
    is not compared: reading it would synchronize its device every step,
    and its repr names the device, another one per rank on GPUs."""
    if isinstance(v, torch.Tensor):
        return "tensor"
    if type(v) is tuple:
        return tuple("tensor" if isinstance(x, torch.Tensor) else x for x in v)
    return v


def _values(param_groups: Iterable[dict]) -> List[List[Any]]:
    return [[(k, _plain(v)) for k, v in group.items() if k in _KEY_SET] for group in param_groups]


def fold(crc: int, param_groups: Iterable[dict]) -> int:
    """`crc` updated with this step's hyperparameters: the CRC of their repr,
    which is the same text on every rank for equal floats, bools, None and
    tuples (no hash(), whose value for None differs between processes)."""
    text = repr([[_plain(v) for k, v in group.items() if k in _KEY_SET]
                 for group in param_groups])
    return zlib.crc32(text.encode("utf-8"), crc)


def describe(param_groups: Iterable[dict]) -> str:
    """'group 0: lr=0.1, momentum=0.9; group 1: ...' (for the error message)."""
    return "; ".join(f"group {g}: " + ", ".join(f"{k}={v!r}" for k, v in items)
                     for g, items in enumerate(_values(param_groups)))


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
