# optimizer_residual.py — where a pooled parameter's gradient lives during a
# step of the torch DistributedOptimizer: adopting a gradient into its pool
# range at the hook (classic pools: copy; residual-in-pool CSC pools: add),
# pointing param.grad at the pool P before backward and at the output G
# after synchronize(), and G's version guard. No communication: the core
# reduces (native/sparse_pool_residual.cc, Note [Residual in the pool]).
"""param.grad placement for gradflow.torch.DistributedOptimizer's pools.

A pool with `out` set keeps the CSC residual in its buffer P (`buf`): P is
never zeroed, autograd adds each gradient into it, the core sends the chosen
chunks out of it and writes the reduced chunks into the second buffer G
(`out`), which is mostly zero. param.grad is a view of P from zero_grad()
until synchronize() ends, and a view of G from then on.
"""

import torch

from .. import _native


def residual_in_pool(s, dtype: torch.dtype) -> bool:
    """Whether a pool of `dtype` keeps its CSC residual in place. Not with a
    grad_scaler (an overflowed step's gradient is already inside P, and
    "residual as it was" needs the classic spare), not with sparse momentum
    (its velocity needs a pass over the buffer every step)."""
    return (s.csc and s.scaler is None and dtype == torch.float32
            and _native.config()["sparse_momentum"] == 0)


def _grad_of(g: torch.Tensor) -> torch.Tensor:
    return g.to_dense() if g.is_sparse else g


def adopt(s, p: torch.Tensor, slot) -> None:
    """Makes param.grad the pool view `slot[2]` holding what this step adds.
    Classic pool: the view must hold the gradient (a replaced p.grad is
    copied in, a missing one of an unmarked parameter is zeros). Residual in
    the pool: the view holds residual + gradient, so a replaced p.grad is
    added in; a p.grad that is the G view (no zero_grad() since the last
    step: autograd accumulated onto last step's result, as torch does) is
    added in and cleared from G. A sparse p.grad (an embedding's, under
    sparse_as_dense or when not agreed sparse: Note [Sparse gradients agreed
    once] in optimizer_state.py; model.zero_grad() made autograd create it)
    is densified first: it has no storage to compare or copy."""
    pool, _, view = slot
    g = None if p.grad is None else _grad_of(p.grad)
    if g is not None and g.data_ptr() == view.data_ptr():
        return
    out_view = s.out_of.get(id(p))
    with torch.no_grad():
        if out_view is None:  # classic pool
            if g is None:
                view.zero_()
            else:
                view.copy_(g)
        elif g is not None:
            view.add_(g)
            if g.data_ptr() == out_view.data_ptr():
                _write_output(s.pools[pool], out_view.zero_)
    p.grad = view


def _write_output(pool, write) -> None:
    """gradflow's own in-place write into G: keeps G's recorded version if G
    was clean (zeroing never breaks "zero outside the chunks written last")."""
    clean = pool.out._version == pool.out_version
    write()
    if clean:
        pool.out_version = pool.out._version


def begin_step(s) -> None:
    """First hook of a step, before any bucket is submitted: if something
    else wrote into G since the last step (clip_grad_norm_, GradScaler's
    unscale_, an in-place weight decay: G's version counter moved), the core
    zeroes all of G before this step's results instead of only last step's
    chunks."""
    for pool in s.pools:
        if pool.out is not None and pool.out._version != pool.out_version:
            _native.pool_output_dirty(pool.id)
            pool.out_version = pool.out._version


def point_at_output(s) -> None:
    """End of synchronize(): the optimizer sees G (this step's reduced chunks,
    zero elsewhere). The core's writes do not move G's version: record it."""
    for p in s.params:
        view = s.out_of.get(id(p))
        if view is not None:
            p.grad = view
    for pool in s.pools:
        if pool.out is not None:
            pool.out_version = pool.out._version


def point_at_pool(s) -> None:
    """zero_grad() of residual-in-pool pools: param.grad becomes the P view
    again (residual, not zeros: nothing is written)."""
    for p in s.params:
        slot = s.range_of.get(id(p))
        if slot is not None and id(p) in s.out_of:
            p.grad = slot[2]


def adopt_unmarked(s) -> None:
    """Pooled parameters whose gradient no hook marked this step (unused on
    this rank: a branch, a task head) still take part, as in Horovod: their
    range gets p.grad (classic pool: zeros if p.grad is None, since
    model.zero_grad() drops it and the view may hold last step's result;
    residual in the pool: nothing is added for None). Afterwards p.grad is
    the view on every rank, so every rank's optimizer updates the parameter
    with the same reduced gradient."""
    for p in s.params:
        slot = s.range_of.get(id(p))
        if slot is not None and id(p) not in s.marked:
            adopt(s, p, slot)
