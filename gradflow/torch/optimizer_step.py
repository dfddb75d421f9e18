# optimizer_step.py — the end of a torch DistributedOptimizer step: draining
# it (synchronize(): submit what no hook submitted, wait every handle and
# bucket, reset the pools) and failing it (abandon(): a step that raised on
# this rank is withdrawn so that every rank fails it at once and the next
# step pairs afresh, Note [A failed step]). Hooks and submission:
# optimizer.py; pool layout: optimizer_state.py. Never communicates itself
# beyond submitting, waiting and withdrawing (the core does the rest).
"""Step draining and step failure of gradflow.torch.DistributedOptimizer.

Note [A failed step]
--------------------
A step whose reduction fails on one rank (a user Compressor raising, an
input the core refuses, a layout agreement that failed) used to leave that
optimizer unusable: autograd aborts the backward at the raising hook, so the
parameters after it were never submitted there while the other ranks
submitted them and waited (until GRADFLOW_TIMEOUT, or for ever while that
rank did something else); the queued end-of-backward callback never ran
(autograd drops it with the failed pass), so `callback_queued` stayed set,
and the step's counts, pool marks and handles stayed, so every later step
raised. Now the rank where it raised abandons the step at once, inside the
raising hook (or synchronize()):

  1. it withdraws (gradflow/_withdrawal.py) every name of the step it has not
     answered for: copy-path names and groups not submitted, the step-1 layout
     agreement, and the pool buckets it did not complete. The other ranks'
     handles of those names fail with its error within a cycle, so their step
     fails too (their backward raises GradflowError naming this rank's error);
  2. it waits for what it did submit (each peer submits or withdraws the same
     names, so every wait ends), so nothing of the step stays in flight and no
     half-submitted bucket pairs with the next step's data;
  3. every rank then forgets the step alike (_forget_step). CSC: a copy-path
     name whose reduction completed in the failed step has its residual
     rolled back at its next submission (exact: the residual is as before the
     step); pools with CSC residuals are dropped and rebuilt, as a new
     optimizer's (the next step is dense, through the copy path), because
     their buckets committed per bucket and only some did: every rank loses
     its unsent error-feedback residual (that gradient mass, not only the
     failed step's), alike on every rank, so the parameters stay bitwise
     identical.

The user catches the exception, calls optimizer.zero_grad() and goes on: the
next step pairs afresh on every rank. A backward that raised outside
gradflow (the user's own hook or autograd Function) after some hooks fired
is not seen here: see the limit in docs/robustness.md.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Set, Tuple

import torch

from .. import _native
from .._runtime import ALLGATHER, ALLREDUCE, GradflowError
from .._withdrawal import withdraw
from . import hyperparameter_check as _hyper_check
from . import optimizer_residual as _residual
from . import sparse_join as _sparse_join
from .optimizer_autotune import after_synchronize as _autotune_step
from .optimizer_groups import GroupTracker, flush_groups
from .optimizer_state import (agree_layout, build_pools, clear_padding, destroy_pools,
                              pool_views_stale, register_late_parameters,
                              register_new_parameters)

def _sparse_zeros(p: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """The zero gradient of `p` as an empty sparse COO tensor with
    `sparse_dim` sparse dimensions (an embedding's: 1), so its indices and
    values allgather against the peers' gradients (same trailing shapes)."""
    return torch.sparse_coo_tensor(torch.zeros(sparse_dim, 0, dtype=torch.int64, device=p.device),
                                   p.new_zeros((0, *p.shape[sparse_dim:])), p.shape,
                                   check_invariants=True, is_coalesced=True)


def begin_step(opt) -> None:
    """First gradient of a step. With CSC and a grad_scaler, read the loss
    scale S the gradients carry: buckets are scaled by 1/S before the
    residual takes them and by S after the reduction, so the residual
    holds unscaled gradients and stays valid when the scaler moves S."""
    s = opt._gradflow
    drop_stale_pools(opt)  # Note [Pool views replaced] (optimizer_state.py)
    scale = float(s.scaler.get_scale()) if s.scaler is not None and s.csc else 1.0
    if not (scale > 0 and scale != float("inf")):
        raise GradflowError(f"gradflow: grad_scaler's scale is {scale}; expected a finite "
                            "positive loss scale")
    if scale != s.loss_scale:
        s.loss_scale = scale
        for pool in s.pools:
            _native.pool_set_scale(pool.id, s.prescale / scale, s.postscale * scale)
    if s.unapplied and s.scaler is not None and s.csc:
        # Note [A skipped step owes its chunks]
        # -------------------------------------
        # The last reduced step
        # never reached step() (GradScaler skipped it: an overflow in some
        # bucket or tensor). The chunks the *finite* buckets sent then
        # would be lost, and their residual no longer holds them, so
        # every classic pool's residuals go back to before that step, as
        # the overflowing buckets' did (every rank skipped alike). The
        # copy path's named residuals roll back in the core when this
        # step's allreduce of each name runs (rollback_residual).
        for pool in s.pools:
            if pool.out is None:
                _native.pool_rollback_residuals(pool.id)
        s.rollback_residuals = True  # the copy path's, by name, as they are submitted
    s.unapplied = False
    _hyper_check.begin_round(s, opt.param_groups)
    _residual.begin_step(s)


def layout_pending(s) -> bool:
    """synchronize() will run agree_layout() (step 1 of this runtime)."""
    return not s.sparse_agreed and not s.solo and (s.use_pool or not s.sparse_as_dense)


def synchronize(opt) -> None:
    """DistributedOptimizer.synchronize()'s work (see its docstring)."""
    s = opt._gradflow
    try:
        for p in s.deferred:  # overlap=False: backward is over, submit now
            opt._gradflow_submit(p)
        s.deferred.clear()
        register_new_parameters(opt)  # swapped in since: Note [Parameters swapped in]
        if any(p.requires_grad for p in s.frozen):  # unfrozen since: Note [Late parameters]
            register_late_parameters(opt)
        if layout_pending(s):
            # Step 1: which parameters are sparse everywhere (and the pools'
            # order), before the zeros below: Note [Sparse gradients agreed once].
            s.answered.add(f"{s.prefix}.layout.size")  # submitted or withdrawn, either way
            agree_layout(opt)
        for p in s.params:  # parameters without a gradient this step: reduce zeros
            if id(p) not in s.handles and id(p) not in s.range_of:
                i = s.index[id(p)]
                if p.grad is None:
                    dim = None if s.sparse_as_dense else s.sparse.get(i)
                    p.grad = torch.zeros_like(p) if dim is None else _sparse_zeros(p, dim)
                opt._gradflow_submit(p)
        if s.groups is not None:  # groups whose dense members are all in now
            flush_groups(s)
        _residual.adopt_unmarked(s)
        for pool in s.pools:
            s.pool_handles.extend(_native.pool_flush(pool.id))
    except BaseException as e:  # Note [A failed step]: fail it everywhere, now
        abandon(opt, e)
        raise
    errors, succeeded, overflow = _drain(s)
    if s.csc:
        clear_padding(s)
    _residual.point_at_output(s)
    for p in s.params:  # Note [Frozen after wrapping]
        if not p.requires_grad:
            p.grad = None
    if errors:
        _sparse_join.REPORT.record(s, errors)  # Note [Sparse gradients and join]
        _forget_step(opt, succeeded)
        raise errors[0]
    _clear_counts(s)
    s.wire_overflow = overflow
    if s.use_pool and not s.pool_built:
        build_pools(opt)
    s.synchronized = True
    remember_grads(s)
    s.unapplied = True  # until step(): Note [A skipped step owes its chunks]
    s.rollback_residuals = False
    s.rollback_names.clear()
    _autotune_step(opt)


def _drain(s) -> Tuple[List[BaseException], Set[str], bool]:
    """Wait every handle of the step (also after an error: nothing may stay in
    flight), then reset the pools. Returns the errors, the copy-path names
    (parameter or group names) whose reduction completed, and whether a
    16-bit wire value overflowed in a bucket."""
    errors: List[BaseException] = []
    outcome: Dict[int, bool] = {}  # id(handle) -> completed (a group's handle is shared)
    succeeded: Set[str] = set()
    for i, p in enumerate(s.params):
        h = s.handles.get(id(p))
        if h is None:
            continue
        if id(h) not in outcome:
            try:
                out = h.wait()
                outcome[id(h)] = True
                if p.grad is not None and p.grad.is_sparse:
                    p.grad = out
            except BaseException as e:  # keep draining so no buffer is left in flight
                outcome[id(h)] = False
                errors.append(e)
        if outcome[id(h)]:
            succeeded.add(unit_name(s, i))
    overflow = False
    for h in s.pool_handles:
        try:
            overflow |= bool(_native.wait(h, s.ps)["wire_overflow"])
        except BaseException as e:
            errors.append(e)
    s.pool_handles.clear()
    for pool in s.pools:
        _native.pool_reset(pool.id)
    return errors, succeeded, overflow


def unit_name(s, i: int) -> str:
    """The name parameter i's copy-path reduction goes under: its group's
    ('<prefix>.group<g>', whose members are '<that>.<k>') or its own."""
    if s.groups is not None and i not in s.sparse:
        return f"{s.prefix}.group{s.groups.group_of[i]}"
    return s.names[i]


def begin_step_or_abandon(opt) -> None:
    """begin_step(); if it raises, the step is abandoned (Note [A failed
    step]: every rank fails it) before the error goes on."""
    try:
        begin_step(opt)
    except BaseException as e:
        abandon(opt, e)
        raise


def abandon(opt, exc: BaseException) -> None:
    """This rank's part of the step raised `exc` (Note [A failed step]):
    withdraw what it will not submit, wait for what it did, forget the step.
    Never raises (the caller re-raises `exc`)."""
    s = opt._gradflow
    if s.solo:  # nothing is exchanged
        _clear_counts(s)
        return
    try:
        for kind, name, size in _unanswered(s):
            withdraw(kind, name, s.ps, exc, size)
        _, succeeded, _ = _drain(s)
        _forget_step(opt, succeeded)
    except Exception:  # noqa: BLE001 - a closed runtime: the original error says more
        _clear_counts(s)


def drop_interrupted(opt) -> None:
    """zero_grad() found the end-of-backward callback still queued and no
    backward running: the backward that queued it raised outside gradflow
    (the user's hook or autograd Function; gradflow's own failures abandon at
    once) after hooks had fired, and autograd dropped the callback. That step
    can never complete here, so it is withdrawn on every rank now (the other
    ranks waited in their synchronize() until this zero_grad())."""
    s = opt._gradflow
    abandon(opt, GradflowError(
        f"gradflow: {s.prefix}: a backward pass raised on this rank after gradflow's hooks had "
        "run, so this step cannot be completed; it is dropped on every rank"))


def _unanswered(s) -> List[Tuple[int, str, int]]:
    """(kind, name, group size) of every collective the other ranks submit in
    this step that this rank neither submitted nor withdrew."""
    out: List[Tuple[int, str, int]] = []
    layout = f"{s.prefix}.layout.size"  # allgather_object: '.data' follows only if it succeeds
    if layout_pending(s) and layout not in s.answered:
        out.append((ALLGATHER, layout, 0))
    seen: Set[str] = set()
    for i, p in enumerate(s.params):
        if id(p) in s.handles or id(p) in s.range_of:
            continue
        unit = unit_name(s, i)
        if unit in s.answered or unit in seen:
            continue
        seen.add(unit)
        if not s.sparse_as_dense and i in s.sparse:
            out += [(ALLGATHER, unit + ".indices", 0), (ALLGATHER, unit + ".values", 0)]
        elif s.groups is not None:
            members = [j for j in s.groups.groups[s.groups.group_of[i]] if j not in s.sparse]
            out += [(ALLREDUCE, f"{unit}.{k}", len(members)) for k in range(len(members))]
        else:
            out.append((ALLREDUCE, unit, 0))
    for pool in s.pools:  # the core's names of the buckets it has not submitted this step
        out += [(ALLREDUCE, name, 0) for name in _native.pool_open_bucket_names(pool.id)]
    return out


def _forget_step(opt, succeeded: Set[str]) -> None:
    """Every rank, after a failed step (Note [A failed step]): nothing is in
    flight any more; drop the step's counts and what CSC cannot keep exact."""
    s = opt._gradflow
    if s.csc:
        # Copy-path names (use_pool=False, groups) whose reduction completed
        # committed their residual: undo it at their next submission. The
        # others never ran. (A grad_scaler skip's rollback_residuals stays.)
        s.rollback_names |= succeeded
        if s.pools:
            _drop_pools(opt)
    _clear_counts(s)
    s.unapplied = False


def _drop_pools(opt) -> None:
    """Pools with CSC residuals after a failed step: only some buckets
    committed, so no residual can go back alone; drop the pools (and every
    residual) on every rank. The next step is dense, through the copy path,
    and builds them again (as a new optimizer's step 1, in the agreed order)."""
    s = opt._gradflow
    ids = [pool.id for pool in s.pools]
    opt._gradflow_finalizer.detach()
    opt._gradflow_finalizer = weakref.finalize(opt, destroy_pools, [])
    destroy_pools(ids)
    s.pools, s.range_of, s.out_of, s.pool_built = [], {}, {}, False
    tuner = getattr(s, "autotuner", None)
    if tuner is not None:  # its pool ids are gone: this optimizer stops tuning (every rank alike)
        s.autotuner = None
        s.autotune_off = True


def drop_stale_pools(opt) -> None:
    """Note [Pool views replaced] (optimizer_state.py): if a pooled parameter
    or its view changed since the pools were built, drop the pools (as
    _drop_pools after a failed step: the next reduction is dense, through the
    copy path, and builds them again). A gradient left with another dtype or
    shape than its parameter (the pool view of a parameter converted while
    it had no gradient) is dropped: autograd makes a new one."""
    s = opt._gradflow
    if not s.pool_built or not pool_views_stale(s):
        return
    _drop_pools(opt)
    for p in s.params:
        g = p.grad
        if g is not None and (g.dtype != p.dtype or g.shape != p.shape or g.device != p.device):
            p.grad = None
    if any(p.device.type != "cpu" for p in s.params):  # the pool is CPU-only
        s.use_pool = False


def _clear_counts(s) -> None:
    """A step's bookkeeping back to 'no step started'."""
    s.handles.clear()
    s.pool_handles.clear()
    s.passes.clear()
    s.marked.clear()
    s.deferred.clear()
    s.answered.clear()
    s.complete, s.passes_done, s.callback_queued = 0, 0, False
    s.fired, s.wire_overflow = False, False
    if s.groups is not None and s.groups.ready:
        s.groups = GroupTracker(s.groups.groups)


def remember_grads(s) -> None:
    """Note [Gradients assigned by hand]: which tensor each param.grad is
    after this synchronize() or zero_grad() (None: no gradient)."""
    s.left = {id(p): None if p.grad is None else weakref.ref(p.grad) for p in s.params}


def assigned_grads(s) -> List[torch.Tensor]:
    """Note [Gradients assigned by hand]: the parameters whose param.grad the
    user replaced since the last synchronize() / zero_grad() without a
    backward (torch.autograd.grad, functorch, a gradient computed by hand)."""
    out = []
    for p in s.params:
        ref = s.left.get(id(p))
        if p.grad is not None and (ref is None or ref() is not p.grad):
            out.append(p)
    return out


def no_gradient_error(s) -> GradflowError:
    """step()/synchronize() with no backward since the last step."""
    return GradflowError(
        f"gradflow: {s.prefix}.step()/synchronize() called but no backward pass produced a "
        "gradient since the last step (step() called twice without backward?)")
