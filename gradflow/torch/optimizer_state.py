# optimizer_state.py — the torch DistributedOptimizer's bookkeeping, kept
# out of optimizer.py (which owns the hook/step protocol): the per-optimizer
# state object, parameter names, the gradient pools' layout and lifetime (build_pools,
# destroy_pools), and the LR-scheduler re-patch applied when wrapping.
"""State, gradient pools and wrapping helpers of gradflow.torch.DistributedOptimizer."""
import os
import sys
import warnings
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from .. import _handles, _native, collectives
from ..collectives import native_reduce_op
from . import hyperparameter_check as _hyper_check
from .functions import allgather_object
from .ops import dtype_code
from .complex_grads import real_dtype
from .optimizer_groups import GroupTracker
from .optimizer_residual import residual_in_pool


class _Pool:
    """One dtype's flat gradient buffer and its native pool id; with the CSC
    residual in the pool (optimizer_residual.py), `buf` is P (residual +
    gradients) and `out` is G (the reduced chunks), whose version counter
    was `out_version` after gradflow's last write."""

    def __init__(self, buf: torch.Tensor, pool_id: int, out: Optional[torch.Tensor] = None,
                 padding: Optional[torch.Tensor] = None):
        self.buf, self.id, self.out = buf, pool_id, out
        self.out_version = None if out is None else out._version
        # Indices of the alignment padding (Note [Aligned pool ranges]) in buf.
        self.padding = padding


_LIVE: "weakref.WeakSet" = weakref.WeakSet()  # every wrapper's _State, for join()


class _State:
    """Everything the wrapper adds, kept off the optimizer's own attributes."""

    def __init__(self):
        _LIVE.add(self)  # for join(): Note [Unfinished step at join]
        self.prefix = ""
        self.params: List[torch.Tensor] = []      # requires_grad params, param-group order
        self.names: List[str] = []                # "<prefix>.<name>", same order
        self.index: Dict[int, int] = {}           # id(param) -> position in params
        self.passes: Dict[int, int] = {}          # id(param) -> hook calls since last sync
        self.handles: Dict[int, object] = {}      # id(param) -> copy-path handle
        self.pool_handles: List[int] = []         # native handles of submitted buckets
        self.order: List[int] = []                # step-1 hook order (indices)
        # index -> sparse_dim of the parameters reduced as sparse gradients
        # (never pooled): locally seen until the step-1 agreement, then the
        # ranks' agreed set, fixed (Note [Sparse gradients agreed once]).
        self.sparse: Dict[int, int] = {}
        self.sparse_agreed = False                # agree_layout() ran in this runtime
        self.unapplied = False                    # synchronized, step() not called since
        self.rollback_residuals = False           # this step's named CSC residuals undo the last
        self.layout_order: List[int] = []         # rank 0's step-1 order, from agree_layout()
        self.pools: List[_Pool] = []
        self.range_of: Dict[int, Tuple[int, int, torch.Tensor]] = {}  # id -> (pool, range, view)
        self.out_of: Dict[int, torch.Tensor] = {}  # id -> view of its pool's G (residual in pool)
        self.pool_built = False
        # What each pooled parameter and its views looked like when the pools
        # were built (Note [Pool views replaced]).
        self.pool_sig: List[tuple] = []            # (param, dtype, shape, strides)
        self.pool_views: List[torch.Tensor] = []   # every pool view (P and G)
        self.pool_ptrs: Tuple[list, list] = ([], [])  # their and the params' data_ptr()s
        self.fired = False                        # a hook ran since the last synchronize
        self.left: Dict[int, object] = {}         # id(param) -> weakref of the grad left there
        self.synchronized = False                 # synchronize() ran since the last hook
        self.should_sync = True                   # False inside skip_synchronize()
        self.wire_overflow = False                # some 16-bit wire value overflowed last step
        self.marked: set = set()                  # id(param) of pooled ranges marked this step
        self.loss_scale = 1.0                     # grad_scaler's scale for this step (CSC only)
        self.groups: Optional[GroupTracker] = None  # Horovod's groups=, or None
        self.runtime_gen = 0                      # _runtime.generation() the pools belong to
        self.solo = False                         # one-rank set: nothing is exchanged
        self.csc = False                          # CSC in effect (residuals exist)
        self.wanted = (False, False)              # (use_pool, csc) asked for, before Note [One rank]
        self.user_compressor = None               # a Horovod-style Compressor, if given
        self.overlap = True                       # False: hooks defer submission to synchronize()
        self.deferred: List[torch.Tensor] = []    # overlap=False: params whose hook ran, in order
        self.complete = 0                         # params whose last pass of the step fired
        self.passes_done = 0                      # backward passes of this step that returned
        self.callback_queued = False              # end-of-backward callback queued (Note [Reduced when backward returns])
        self.auto_synced = False                  # reduced when backward returned, step() not yet run
        # Copy-path names (parameter or '<prefix>.group<g>') answered for in
        # this step: submitted, or withdrawn (Note [A failed step], optimizer_step.py).
        self.answered: set = set()
        self.rollback_names: set = set()          # their CSC residual undoes its last step when next submitted
        self.named: Dict[int, str] = {}           # id(param) -> name from named_parameters
        self.frozen: List[torch.Tensor] = []      # in param_groups, requires_grad=False (Note [Late parameters])
        self.hook = None                          # the post-accumulate-grad hook (weakly bound)
        self.hyper_rounds = 0                     # reduction rounds counted by hyperparameter_check
        self.hyper_crc = 0                        # running CRC of the hyperparameters
        self.seen_scaler = None                   # GradScaler stepping us (Note [Loss scales agree])
        self.step_tag = ""                        # this round's step tag (Note [Step tags]) or ""


def parameter_names(s, param_groups, named_parameters) -> List[str]:
    """'<prefix>.<name>' of each of s.params: from named_parameters (all
    must be named, no duplicates), else 'group<g>.param<i>'."""
    if named_parameters is None:
        return [f"{s.prefix}.{position_name(param_groups, p)}" for p in s.params]
    named = list(named_parameters)
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise ValueError("gradflow: named_parameters should be a sequence of (name, parameter), "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"gradflow: named_parameters contains duplicate names: {dups}")
    by_id = {}
    for n, p in named:
        by_id.setdefault(id(p), n)
    s.named = by_id  # names for parameters registered later (Note [Late parameters])
    missing = [i for i, p in enumerate(s.params) if id(p) not in by_id]
    if missing:
        raise ValueError(f"gradflow: named_parameters was given but {len(missing)} optimizer "
                         "parameter(s) are not in it; name every parameter")
    return [f"{s.prefix}.{by_id[id(p)]}" for p in s.params]


def position_name(param_groups, p: torch.Tensor) -> str:
    """'group<g>.param<i>': where `p` first appears in the param groups."""
    for g, group in enumerate(param_groups):
        for i, q in enumerate(group["params"]):
            if q is p:
                return f"group{g}.param{i}"
    raise ValueError("gradflow: parameter not in the optimizer's param_groups")


def register_late_parameters(self) -> List[int]:
    """Register the parameters of `self`'s (a DistributedOptimizer's)
    `s.frozen` that now require grad (Note [Late parameters] in
    optimizer.py); returns their indices. Their names follow named_parameters
    where it named them, else their place in the param groups; the order is
    the param groups', the same on every rank. They get the same hook as the
    others and, once the pool exists, stay on the copy path."""
    s = self._gradflow
    added, still = [], []
    for p in s.frozen:
        if id(p) in s.index:
            continue
        if not p.requires_grad:
            still.append(p)
            continue
        name = f"{s.prefix}.{s.named.get(id(p)) or position_name(self.param_groups, p)}"
        if name in s.names:
            name = f"{name}.late{len(s.params)}"
        i = s.index[id(p)] = len(s.params)
        s.params.append(p)
        s.names.append(name)
        s.hook_handles.append(p.register_post_accumulate_grad_hook(s.hook))
        if s.groups is not None:  # a group of its own, as an ungrouped parameter
            s.groups.group_of[i] = len(s.groups.groups)
            s.groups.groups.append([i])
        added.append(i)
    s.frozen = still
    return added


def register_new_parameters(self) -> None:
    """Note [Parameters swapped in]: parameters found in the param groups
    that the wrapper never saw (the user replaced a model's parameter,
    `model.fc.weight = nn.Parameter(...)`, and put the new one in the
    optimizer's group in place of the old) are handed to
    register_late_parameters() as a parameter of add_param_group() would
    be. Before, their gradients were never reduced: each rank stepped its
    own (silent drift). The replaced parameter, no longer in a group, stays
    registered and is reduced as zeros (the layout and names stay the same
    on every rank); the optimizer no longer steps it."""
    s = self._gradflow
    known = None
    for group in self.param_groups:
        for p in group["params"]:
            if id(p) in s.index:
                continue
            if known is None:
                known = {id(q) for q in s.frozen}
            if id(p) not in known:
                known.add(id(p))
                s.frozen.append(p)


# Note [Pool views replaced]
# --------------------------
# A pooled param.grad is a view of the pool. torch code that converts a
# module after the pools exist (model.double(), .half(), .to(bfloat16),
# .to(memory_format=torch.channels_last)) sets `param.data` and
# `param.grad.data` to new tensors: the view object then holds its own
# storage, the hooks still marked the pool's range, so the core reduced the
# pool's stale bytes while the optimizer applied the rank's local gradient
# (found by the 2026-11-29 feature-combination audit: model.double() after
# step 2 left the ranks' parameters different, silently; with CSC's residual
# in the pool the next zero_grad() raised torch's dtype error). zero_grad()
# and the first hook of each step compare each pooled parameter (dtype,
# shape, strides) and view (storage address) with what the pools were built
# for; on a change every rank that made it drops the pools as a failed
# step does (Note [A failed step]): that step is dense, through the copy
# path, and the pools are built again for the new dtypes and layouts. A
# change on some ranks only fails its steps on every rank (the names differ:
# the stall error of GRADFLOW_TIMEOUT), never trains apart.


def pool_views_stale(s) -> bool:
    """Note [Pool views replaced]: whether a pooled parameter or its pool
    view changed since the pools were built. Storage addresses first (one
    C call per tensor and check); a parameter given new storage (`p.data =
    ...`) is looked at closer and is stale only if its dtype, shape or
    strides changed."""
    views, params = s.pool_ptrs
    if _ptrs(s.pool_views) != views:
        return True
    now = _ptrs(sig[0] for sig in s.pool_sig)
    if now != params:
        for p, dtype, shape, stride in s.pool_sig:
            if p.dtype != dtype or p.shape != shape or p.stride() != stride:
                return True
        s.pool_ptrs = (views, now)  # same kinds of tensor: the pools still fit them
    return False


def destroy_pools(ids: List[int], bufs: Tuple = (), handles: List[int] = (),
                   ps: int = 0) -> None:
    for h in handles:  # buckets still in flight keep their pool buffer alive
        try:
            _handles.release(h, bufs, ps)
        except Exception:
            pass
    for i in ids:
        try:
            _native.pool_destroy(i)
        except Exception:
            pass


# Note [Aligned pool ranges]: every range starts on a 64-byte boundary (its
# size is rounded up; the padding stays zero on every rank, so it reduces to
# zero). A GEMM that accumulates into a pool view (FusedLinear's addmm_)
# whose start is 36-60 bytes past a 64-byte boundary ran 2.5x slower here
# (33 against 13 ms for 4096x4096, benchmarks/results/fused-linear/), and
# packed ranges put most views there.
POOL_ALIGN_BYTES = 64


def pool_range_elements(numel: int, dtype: torch.dtype) -> int:
    """Elements a parameter of `numel` elements takes in a pool: rounded up
    so the next range starts POOL_ALIGN_BYTES-aligned."""
    per = max(1, POOL_ALIGN_BYTES // dtype.itemsize)
    return -(-numel // per) * per


def agree_layout(self) -> None:
    """Note [Sparse gradients agreed once]: at the first synchronize()
    (step 1, or the first step after an elastic reset) the ranks agree, in
    one small allgather, on rank 0's step-1 order (the pools' layout) and
    on which parameters are reduced as sparse gradients: those whose
    gradient some rank saw sparse (an nn.Embedding(sparse=True)), with the
    smallest sparse_dim any rank saw. It runs before the zeros of the
    parameters without a gradient are submitted, so a rank on which an
    embedding got no gradient (unused there, or not at all yet) submits
    sparse zeros like its peers' sparse gradients instead of a dense
    allreduce they never match. From then on the set is fixed on every
    rank (optimizer.py's _gradflow_submit): a parameter in it always goes
    the sparse path, any other always the dense one (a sparse gradient of
    it is densified, as sparse_as_dense does)."""
    s = self._gradflow
    local = dict(s.sparse)
    if not s.sparse_as_dense:  # sparse gradients not submitted yet (accumulating passes)
        for i, p in enumerate(s.params):
            g = p.grad
            if g is not None and g.is_sparse:
                local[i] = min(g.sparse_dim(), local.get(i, g.sparse_dim()))
    everyone = allgather_object((s.order, sorted(local.items())), name=f"{s.prefix}.layout",
                                process_set=s.process_set)
    agreed: Dict[int, int] = {}
    for _, seen in everyone:
        for i, dim in seen:
            agreed[i] = min(dim, agreed.get(i, dim))
    s.sparse, s.layout_order, s.sparse_agreed = agreed, list(everyone[0][0]), True


def build_pools(self) -> None:
    """Lay `self`'s (a DistributedOptimizer's) gradients out in rank 0's
    step-1 order (agreed by agree_layout()), one pool per dtype, and
    register the pools with the core. Parameters agreed sparse stay out."""
    s = self._gradflow
    s.pool_sig, s.pool_views = [], []
    sparse = s.sparse
    first = s.layout_order
    order = list(first) + [i for i in range(len(s.params)) if i not in first]
    layout = [i for i in order if i not in sparse and s.params[i].numel() > 0]
    by_dtype: Dict[torch.dtype, List[int]] = {}
    for i in layout:  # complex gradients in their real dtype's pool: Note [Complex gradients]
        by_dtype.setdefault(real_dtype(s.params[i].dtype), []).append(i)
    for dtype, idxs in by_dtype.items():
        reals = [s.params[i].numel() * (2 if s.params[i].is_complex() else 1) for i in idxs]
        sizes = [pool_range_elements(n, dtype) for n in reals]
        total = sum(sizes)
        buf = torch.zeros(total, dtype=dtype)  # torch's CPU allocator: 64-byte aligned
        # Residual in the pool: P (buf) starts as the zero residual and G
        # (out) holds step 1's reduced gradients; else buf holds them.
        out = torch.zeros(total, dtype=dtype) if residual_in_pool(s, dtype) else None
        off, ranges, padding = 0, [], []
        pool_index = len(s.pools)
        with torch.no_grad():
            for r, (i, n, size) in enumerate(zip(idxs, reals, sizes)):
                p = s.params[i]
                view = _range_view(buf, off, n, p)
                seen = view if out is None else _range_view(out, off, n, p)
                if p.grad is not None:
                    seen.copy_(p.grad)
                p.grad = seen
                s.range_of[id(p)] = (pool_index, r, view)
                s.pool_sig.append((p, p.dtype, p.shape, p.stride()))
                s.pool_views.extend([view] if out is None else [view, seen])
                if out is not None:
                    s.out_of[id(p)] = seen
                ranges.append(size)  # the padding travels as zeros (see clear_padding)
                padding.extend(range(off + n, off + size))
                off += size
        pid = _native.pool_create(buf.data_ptr(), dtype_code(dtype), ranges, s.bucket_bytes,
                                  native_reduce_op(s.op), s.wire, s.prescale / s.loss_scale,
                                  s.postscale * s.loss_scale, s.sparse_ratio, s.ps,
                                  0 if out is None else out.data_ptr())
        # Step 1 (dense, copy path) counts towards GRADFLOW_SPARSE_WARMUP_STEPS.
        _native.pool_reset(pid)
        s.pools.append(_Pool(buf, pid, out,
                             torch.tensor(padding, dtype=torch.int64) if padding else None))
        self._gradflow_finalizer.detach()
        self._gradflow_finalizer = weakref.finalize(self, destroy_pools,
                                                    [q.id for q in s.pools],
                                                    tuple(q.buf for q in s.pools) +
                                                    tuple(q.out for q in s.pools if q.out is not None),
                                                    s.pool_handles, s.ps)
    s.pool_ptrs = (_ptrs(s.pool_views), _ptrs(sig[0] for sig in s.pool_sig))
    s.pool_built = True


def _ptrs(tensors) -> list:
    return list(map(torch.Tensor.data_ptr, tensors))


def _range_view(buf: torch.Tensor, off: int, n: int, p: torch.Tensor) -> torch.Tensor:
    """`p`'s gradient as a view of the `n` elements of `buf` from `off` (a
    complex parameter's as view_as_complex of n = 2 * numel floats), with
    `p`'s own strides when `p` is dense (channels_last, transposed), as DDP's
    bucket views: torch's gradient layout contract then holds (autograd
    warned "grad and param do not obey the gradient layout contract" for
    every such parameter, and accumulated across layouts)."""
    flat = buf[off:off + n]
    strides = torch.empty_like(p, device="meta").stride()  # p's if dense, else contiguous
    if p.is_complex():
        pairs = flat.as_strided((*p.shape, 2), tuple(2 * st for st in strides) + (1,))
        return torch.view_as_complex(pairs)
    return flat.as_strided(p.shape, strides)


def clear_padding(s) -> None:
    """After a classic pool's CSC step: zero the alignment padding. CSC writes
    whole chunks, and a chunk with a non-finite value (a GradScaler overflow)
    comes back non-finite everywhere, padding included. Nothing else writes
    the padding (zero_grad() on the optimizer zeroes the whole buffer,
    model.zero_grad() does not), so a NaN left there would make every later
    step's chunk importance NaN: every step an overflow, the loss scale
    halved for ever. Residual-in-pool pools write their results into G and
    drop a non-finite chunk's residual, so only classic pools need this."""
    for pool in s.pools:
        if pool.out is None and pool.padding is not None:
            pool.buf.index_fill_(0, pool.padding, 0)


def rebind_after_elastic_reset(self) -> None:
    """The elastic run loop re-formed the group (gradflow/elastic): the pools
    and handles of `self` belong to the runtime that was shut down. Forget
    them and whatever the interrupted step had counted; the gradients' pool
    views stay valid (the buffers are ours). The next step is dense (copy
    path) and rebuilds the pools with the new group, as a fresh optimizer's
    first step does on every rank, newcomers included. CSC residuals are
    dropped with the old pools: after a lost peer the model rolls back to
    the commit anyway, and on hosts added the step's update stays exact
    (only the not-yet-sent remainder of earlier steps is lost)."""
    from .. import _runtime  # noqa: PLC0415
    s = self._gradflow
    self._gradflow_finalizer.detach()
    self._gradflow_finalizer = weakref.finalize(self, destroy_pools, [])
    s.pools, s.range_of, s.out_of, s.pool_built, s.order = [], {}, {}, False, []
    s.pool_sig, s.pool_views = [], []
    # Agreed again at the next synchronize(), newcomers included: from what
    # each rank sees then, as in a fresh optimizer's step 1.
    s.sparse, s.sparse_agreed, s.layout_order = {}, False, []
    s.handles.clear()
    s.pool_handles.clear()
    s.passes.clear()
    s.marked.clear()
    s.deferred.clear()  # overlap=False: gradients of the interrupted step
    s.answered.clear()
    s.rollback_names.clear()  # their residuals went with the old runtime
    s.fired = s.synchronized = s.auto_synced = s.callback_queued = False
    s.complete = s.passes_done = 0
    s.loss_scale = 1.0
    _hyper_check.reset(s)  # every rank, newcomers included, counts rounds from 0
    if s.groups is not None:
        s.groups = GroupTracker(s.groups.groups)
    # The group may have shrunk to one worker or grown from one (Note [One rank]).
    s.solo = _runtime.size() == 1 and s.user_compressor is None
    s.use_pool, s.csc = (False, False) if s.solo else s.wanted
    s.runtime_gen = _runtime.generation()


# Note [Unfinished step at join]
# -------------------------------
# With backward_passes_per_step=k, a rank whose data ends inside a window
# (it ran j < k passes since its last step, then calls join(), as a loop
# that steps every k batches does when its batch count is not a multiple of
# k) keeps those j passes counted. After join() every rank starts the next
# epoch, but that rank reduces after k - j passes while the others wait for
# k: its buckets and the others' never pair up, and the job stalled until
# GRADFLOW_TIMEOUT (found by the 2026-11-28 combination audit; Horovod's
# delay counters do the same). Those j passes cannot be reduced with
# anything (the other ranks are in other windows), so join() drops the
# unfinished step on every rank: the counts start again, the gradients stay
# in param.grad (zero_grad() clears them, as for any local gradient), and a
# warning says so. Call step() before join() to apply them instead (a step
# of j passes, reduced with the others' next step). Nothing was submitted in
# such a step (a gradient goes out at its k-th pass), so nothing is pending.


def drop_unfinished_step(s) -> int:
    """join() returned: forget the backward passes of a step that was
    started (a hook fired) but never reduced; returns how many passes were
    dropped (0: none, or something was already submitted and the step is
    left as it is)."""
    if not s.fired or s.handles or s.pool_handles or s.marked:
        return 0
    dropped = max(s.passes_done, max(s.passes.values(), default=0))
    s.passes.clear()
    s.deferred.clear()  # overlap=False: recorded, not submitted
    s.complete = s.passes_done = 0
    s.fired = s.synchronized = False
    if s.groups is not None:
        s.groups = GroupTracker(s.groups.groups)
    return dropped


def _outside_gradflow() -> int:
    """warnings.warn's stacklevel, for a call from _after_join, that names
    the first frame outside the gradflow package (the user's join() call,
    whether through gradflow.torch.join or gradflow.join)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2  # 1: _after_join itself
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _after_join() -> None:
    for s in list(_LIVE):
        dropped = drop_unfinished_step(s)
        if dropped:
            warnings.warn(
                f"gradflow: {s.prefix}: join() was called with {dropped} of "
                f"backward_passes_per_step={s.bpps} backward passes of a step that was not "
                "reduced; they are dropped (their gradients stay in param.grad until "
                "zero_grad()) so that every rank starts the next step together. Call step() "
                "before join() to apply them", stacklevel=_outside_gradflow())


collectives.after_join.append(_after_join)


def repatch_scheduler_step(wrapped, optimizer) -> None:
    """An LR scheduler created before wrapping replaced `optimizer.step` by an
    instance attribute that counts calls and then runs the *original class's*
    step on the original object; copied into `wrapped`, it would skip
    gradflow's step (no synchronize: ranks would silently diverge). Run
    gradflow's step instead and keep the count the scheduler reads."""
    patched = wrapped.__dict__.pop("step", None)
    if patched is None:
        return
    gradflow_step = type(wrapped).step

    def step(*args, **kwargs):
        optimizer._opt_called = True  # what torch's wrapper records for the scheduler
        return gradflow_step(wrapped, *args, **kwargs)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    wrapped.step = step
