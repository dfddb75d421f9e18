# hyperparameter_check.py — catches ranks that train with different optimizer
# hyperparameters (learning rate, momentum, weight decay, ...), at no traffic.
"""Every rank applies the same averaged gradient, so the ranks' weights stay
identical only if every rank's optimizer uses the same hyperparameters.
Nothing in data-parallel training enforces that: ``ReduceLROnPlateau``
stepped on each rank's own validation loss, or a scheduler restored on rank 0
only, gives the ranks different learning rates, and their weights drift
apart silently (under DDP and Horovod too).

The first gradient of each reduction round (``begin_round``, from the
wrapper's hook) folds the standard hyperparameters of every param group
into a running CRC (~9 µs a round for one SGD param group, measured),
so a difference that lasted a single step is still seen.
Every ``CHECK_EVERY``-th round, every allreduce the round submits (pool
buckets, copy-path gradients, groups) carries the step tag
``hyperparameters #<crc> now <current values>`` (native Note [Step tags]).
The tag is part of the collective's signature: when two ranks' tags differ,
rank 0 aborts the job at once and every rank raises ``GradflowError``
naming both ranks' current values. Nothing extra is sent: the tagged round
and the one after it miss the response cache (two slow-path negotiations
every ``CHECK_EVERY`` rounds).

Alignment: the tag goes out in the same round on every rank because every
rank takes part in every round (a round is a set of collectives all ranks
submit); ranks that called ``join()`` submit nothing and are not compared.
The count restarts with the optimizer, after an elastic reset (``reset``),
on newcomers and old workers alike, and after ``join()``, where ranks that
ran out of data earlier counted fewer rounds (an epoch per ``join()``, as
Horovod's examples do); ``broadcast_optimizer_state`` (which makes the
values equal) restarts the CRC. Only the keys below are
hashed, and the wrapper's ``backward_passes_per_step``, the parameters
frozen after wrapping and the count of step() calls (shown after group 0's
keys): a key a user keeps in a param group for their own purposes may
legitimately differ. Values are compared as they act (1, 1.0 and numpy's
float64(1.0) alike); a tensor value is compared if it is a CPU scalar, not
on another device (a capturable optimizer's lr: see _plain). Sparse gradients
travel by allgather, which carries no tag: a model whose every gradient is
sparse is not checked.

Note [Loss scales agree]
------------------------
An AMP GradScaler's state is rank-local too: a scaler resumed from a
checkpoint on rank 0 only (init scales 2^16 and 2^10, 2 ranks) scaled
that rank's gradients differently, every rank unscaled the same average by
its own scale, and the weights differed after the first step, silently
(max difference 6.1 after 40 steps, with and without grad_scaler=;
README's former known limit). The round's fold therefore includes the
scaler's scale, growth tracker and growth settings (`scaler_values`),
read in begin_round: at the first gradient of the round, so the scale the
round's gradients carry (update() ran after the last step). The scale
moves legitimately on overflow, alike on every rank: unscale_ finds infs
in the *reduced* gradients, which are bitwise equal everywhere, so
found_inf and update() agree and equal scales stay equal; a rank whose
scale moved otherwise (a second, local optimizer stepped by the same
scaler) fails the check like any other difference. The scaler is the one
given as grad_scaler= (Lightning's AMP plugin passes its own), else the
one first seen calling step() (`note_caller`: GradScaler.step calls the
optimizer's step() itself), from the round after that step on.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable, List, Sequence

import torch

from .. import _native, collectives
from .. import hyperparameter_tag as _tag
from ..hyperparameter_tag import CHECK_EVERY  # noqa: F401  (tests and docs name it here)

# The hyperparameters of torch.optim's optimizers.
KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "betas", "eps", "amsgrad",
        "maximize", "alpha", "centered", "lr_decay", "initial_accumulator_value", "rho",
        "lambd", "t0", "etas", "step_sizes", "momentum_decay", "decoupled_weight_decay")


def _other(v: Any) -> Any:
    """A CPU scalar tensor is the number it holds (0.1 and tensor(0.1) are
    the same learning rate). A tensor on another device (a fused or
    capturable optimizer's lr) is not compared: reading it would
    synchronize that device every step."""
    if isinstance(v, torch.Tensor):
        return float(v) if v.device.type == "cpu" and v.numel() == 1 else "tensor"
    return v


def _plain(v: Any) -> Any:
    return _tag.plain(v, _other)


def scaler_values(scaler) -> List[Any]:
    """Note [Loss scales agree]: what of `scaler` every rank must share.
    Duck-typed (grad_scaler= needs only get_scale()). On CUDA each read is
    a device sync, as grad_scaler='s CSC use already was."""
    if scaler is None:
        return []
    if not getattr(scaler, "is_enabled", lambda: True)():
        return [("enabled", False)]
    values = [("scale", _plain(scaler.get_scale()))]
    for key, getter, kind in (("growth_tracker", "_get_growth_tracker", int),
                              ("growth_factor", "get_growth_factor", _plain),
                              ("backoff_factor", "get_backoff_factor", _plain),
                              ("growth_interval", "get_growth_interval", int)):
        read = getattr(scaler, getter, None)
        if callable(read):
            values.append((key, kind(read())))
    return values


def note_caller(s, frame) -> None:
    """Called by the wrapper's step() with its caller's frame: a GradScaler
    stepping this optimizer (scaler.step(opt), without grad_scaler=) is
    checked from the next round on, on every rank alike (every rank's
    scaler skips or steps the same steps: Note [Loss scales agree])."""
    if s.scaler is not None or getattr(s, "seen_scaler", None) is not None:
        return
    amp = getattr(torch, "amp", None)
    kind = getattr(amp, "GradScaler", None)
    for _ in range(3):  # GradScaler.step -> _maybe_opt_step -> (step wrappers: a scheduler's)
        if frame is None or kind is None:
            return
        if frame.f_code.co_name in ("_maybe_opt_step", "step"):  # f_locals builds a dict: not every frame
            me = frame.f_locals.get("self")
            if isinstance(me, kind):
                s.seen_scaler = me
                return
        frame = frame.f_back


def _values(param_groups: Iterable[dict]) -> List[List[Any]]:
    """In KEYS' order, not the dict's: a group rebuilt by load_state_dict
    (a checkpoint of another torch version) may hold its keys in another."""
    return [[(k, _plain(group[k])) for k in KEYS if k in group] for group in param_groups]


def _with_passes(values: List[List[Any]], bpps: int, frozen: Sequence[str] = (),
                 steps: Any = None) -> List[List[Any]]:
    """`values` with the wrapper's backward_passes_per_step after group 0's
    keys. It is local too (set_backward_passes_per_step on one rank, or a
    value computed from the rank's own data): with 1 on one rank and 2 on
    another, each reduction averaged one pass with the sum of two and the
    weights stayed alike, so nothing showed until the rank with fewer steps
    finished and the other failed naming no cause (found by the round-4
    combination audit).

    Note [Frozen on some ranks]: then the names of the parameters frozen
    after wrapping (requires_grad=False at this round), if any. A rank
    that freezes one alone reduces zeros for it and keeps it put (Note
    [Frozen after wrapping] in optimizer.py) while the others apply the
    average: the weights drifted apart silently (2 ranks, a Linear's weight
    frozen on rank 0 at step 2: ranks differ after 4 steps, no error; found
    by the 2026-11-29 combination audit). Horovod applies the average on
    every rank there; the check makes the rank-local freeze an error.

    Note [Steps per round]: then how many times step() ran since the count
    restarted. A rank that ran one backward pass more than the others
    before a step() (bpps=1: that pass starts a new round, Note [Reduced
    when backward returns]), or skipped a step() after its reduction (a
    rank-local `if torch.isfinite(loss): opt.step()`), pairs its rounds
    with the others' rounds of other steps: the rounds still agree, so
    nothing showed; the weights drifted apart (momentum applied the same
    gradients at other steps) and the job stalled at its end (2 ranks, one
    extra pass at step 2: a 60 s stall after step 40; found by the
    2026-11-29 combination audit)."""
    extra = [("backward_passes_per_step", int(bpps))]
    if frozen:
        extra.append(("frozen", tuple(frozen)))
    if steps is not None:
        extra.append(("steps", int(steps)))
    return [list(values[0]) + extra] + values[1:] if values else [extra]


def fold(crc: int, param_groups: Iterable[dict]) -> int:
    """`crc` updated with the current hyperparameters (hyperparameter_tag.fold)."""
    return _tag.fold(crc, _values(param_groups))


def describe(param_groups: Iterable[dict]) -> str:
    """'group 0: lr=0.1, momentum=0.9; group 1: ...', cut to a bounded length."""
    return _tag.describe(_values(param_groups))


_LIVE: "weakref.WeakSet" = weakref.WeakSet()  # every wrapper's state, for after_join


def restart_crc(s) -> None:
    """The ranks' values were just made equal (broadcast_optimizer_state):
    differences before it no longer matter. Collective, so every rank does
    it at the same point of its rounds."""
    s.hyper_crc = 0


def _restart_count(s) -> None:
    s.hyper_rounds = 0
    s.hyper_steps = 0
    # Found again at the next step() on every rank alike: a newcomer or a
    # rank that joined before any step() has not seen it (Note [Loss scales agree]).
    s.seen_scaler = None
    restart_crc(s)


def count_step(s) -> None:
    """The wrapper's step() ran (Note [Steps per round])."""
    s.hyper_steps = getattr(s, "hyper_steps", 0) + 1


def reset(s) -> None:
    """A new optimizer or a new runtime (elastic reset): count from 0 again."""
    _restart_count(s)
    s.step_tag = ""
    _LIVE.add(s)


def _after_join() -> None:
    """Every rank returns from join() together, whatever rounds it ran
    before. The step tag stays: the next begin_round clears it from the pools."""
    for s in list(_LIVE):
        _restart_count(s)


collectives.after_join.append(_after_join)


def begin_round(s, param_groups: List[dict]) -> None:
    """First gradient of a reduction round, before anything is submitted:
    fold the current values in and choose this round's step tag."""
    if s.solo:
        return
    cut = len(s.prefix) + 1
    frozen = [s.names[i][cut:] for i, p in enumerate(s.params) if not p.requires_grad]
    values = _with_passes(_values(param_groups), s.bpps, frozen,
                          getattr(s, "hyper_steps", 0))
    s.hyper_crc = _tag.fold(s.hyper_crc, values)
    scaler = scaler_values(getattr(s, "scaler", None) or getattr(s, "seen_scaler", None))
    if scaler:  # Note [Loss scales agree]
        s.hyper_crc = _tag.fold(s.hyper_crc, [scaler])
    s.hyper_rounds += 1
    tag = _tag.tag(s.hyper_crc, values, scaler, "grad_scaler") \
        if _tag.is_check_round(s.hyper_rounds) else ""
    if tag or s.step_tag:  # pools built since the last tagged round start untagged
        for pool in s.pools:
            _native.pool_set_step_tag(pool.id, tag)
    s.step_tag = tag
