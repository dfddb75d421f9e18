# optimizer.py — the DistributedOptimizer wrapper's methods: each gradient
# is submitted to the core while backward runs, and the reductions are
# waited for when the step's last backward returns (else in step()). Owns
# the hooks, submission and the public step methods (draining a step and
# failing it: optimizer_step.py; state, pool layout and scheduler re-patch:
# optimizer_state.py; set-up: optimizer_setup.py; the public factory and its
# keyword documentation: distributed_optimizer.py; the hyperparameter check:
# hyperparameter_check.py); never communicates itself (the core does).
"""DistributedOptimizer, in the manner of PyTorch DDP's reducer.

Terms:
  range   one parameter's gradient, `numel` elements of the pool.
  pool    one flat tensor per dtype holding the gradients of all pooled
          parameters, laid out in backward order; each `param.grad` is a view
          of it. The native core knows it as (pool id, list of range sizes).
  bucket  a run of whole ranges, <= bucket_mb (default GRADFLOW_POOL_BUCKET_BYTES);
          cut once by the core (grad_pool.h). When the last range of a bucket
          is marked ready, the core allreduces it in place: no fusion copy.
  pass    one backward; `backward_passes_per_step` passes make one step.

Life of the wrapper:
  step 1 (copy path). Hooks (`register_post_accumulate_grad_hook`) fire in
    backward order; each gradient goes out with `allreduce_async_` under the
    name "<prefix>.<param name>", and the order is recorded. synchronize()
    first agrees (one small allgather, so all ranks agree) on rank 0's order
    and on which parameters are reduced as sparse gradients (Note [Sparse
    gradients agreed once] in optimizer_state.py), then submits zeros for
    the parameters without a gradient and waits; then every rank builds one
    pool per dtype in that order, copies the reduced gradients in and points
    every `param.grad` at its view. The copy path agrees on the sparse set
    alike (unless sparse_as_dense).
  step >= 2 (pool path). A hook calls `pool_mark_ready(pool, range)`, which
    returns a handle when it completed a bucket; step() calls `pool_flush`
    for the buckets not complete (a parameter no hook marked this step
    contributes its p.grad, or zeros if p.grad is None, and gets its pool view
    back as p.grad on every rank, so every rank updates it alike), waits every
    handle, then `pool_reset`, then runs the wrapped optimizer's step.
  CSC (sparse_ratio < 1): step 1 is dense; from step 2 each pool bucket
    has its residual. Float32 pools without grad_scaler= or sparse momentum
    keep it in the pool buffer itself (optimizer_residual.py, Note [Residual
    in the pool] in native/sparse_pool_residual.cc): param.grad is a view of
    the pool P (residual + this step's gradients) from zero_grad() until
    synchronize() ends, then a view of a second buffer G (the reduced sent
    chunks). Others keep the classic residual, owned by the pool (api.cc).
    With use_pool=False the core keeps one residual per parameter name.
  use_pool=False keeps the copy path for ever (the core fuses small tensors
    through its fusion buffer: that is the copy the pool avoids).
  overlap=False: hooks only record; synchronize() submits (see the keyword).

Note [Reduced when backward returns]: DDP users touch param.grad between
  backward() and step() without a synchronize() (clip_grad_norm_,
  PyTorch's plain AMP recipe, whose scaler.step(opt) unscales first). Done
  while the core still reduced in place, that raced with it and the ranks'
  parameters silently drifted apart (Horovod has the same race and
  documents synchronize() + skip_synchronize() instead). So the first hook
  of each backward pass queues an autograd-engine callback (as DDP's
  reducer does); when the pass returns and every parameter got the step's
  last gradient (`complete == len(params)`), or the pass was the step's
  last one (the `backward_passes_per_step`-th), it runs synchronize(),
  which reduces zeros for the parameters without a gradient (an unused
  head, a branch taken on some ranks only; as Horovod's synchronize(), and
  as DDP's find_unused_parameters but for a parameter no rank used, which
  DDP leaves at None): param.grad then holds the reduced gradient, as
  under DDP, and step() only runs the wrapped step. The hooks still submit
  during backward, so communication still overlaps backward; only the tail
  wait moves from step() to the end of backward. A backward pass after
  that and before step() (GradScaler skipped the step on an overflow, or a
  second pass with backward_passes_per_step=1) starts a new step: its
  gradients add onto the reduced ones and are reduced in turn, so the step
  applies the sum of both averages, as plain torch applies the sum of both
  gradients (with an op other than Average that would reduce reduced
  gradients again, so there such a pass raises unless
  optimizer.zero_grad() ran in between). An explicit synchronize()
  afterwards is a no-op (Horovod's pattern keeps working, and step() after
  it without skip_synchronize() still warns as in Horovod). Two passes of
  one step over different parameters (bpps=1) are thus two reductions, the
  second carrying the first's result: the sum of both averages again. A
  reentrant backward (checkpoint(use_reentrant=True)) ends inside a node
  of the outer pass (torch._C._current_autograd_node() is set): not a pass
  end. Limit: when every gradient of a step with an unused parameter comes
  out of such a reentrant backward, the outer pass fires no hook, queues
  no callback, and the step is reduced in step() as before (call
  synchronize() first there, as under Horovod).

Note [One rank]: over a one-rank process set (no user Compressor) the
  reduced gradient is the gradient, bit for bit, as in Horovod and DDP: no
  pool, loop round trip, wire cast or CSC (no link to save bytes on; error
  feedback would only delay gradient mass), no predivide or loss-scale
  factors (they cancel). param.grad stays autograd's tensor; hooks still
  count passes, so the step-protocol errors raise as on N ranks
  (docs/performance.md, "One rank costs nothing").

Invariants:
  * Every rank creates the same pools (same parameters, same order, same
    range sizes, same bucket size), so bucket names
    "gradflow.pool<id>.bucket<b>" and sizes agree everywhere (deadlock
    freedom: the coordinator matches buckets by name; any order is fine).
  * A range is marked at most once per step: hooks are counted per parameter
    and only the `backward_passes_per_step`-th call submits; the step is
    reduced when that pass returns, so a further call starts the next step
    (Note [Reduced when backward returns]; with an op other than Average it
    raises unless zero_grad() ran).
  * Pool views survive: `zero_grad(set_to_none=True)` zeroes the pool in
    place instead of dropping views (documented deviation). If something
    else replaces `param.grad` (e.g. `model.zero_grad()`), the hook copies
    the new gradient into its view and re-points `param.grad` (one copy).
    A module converted once the pools exist (model.double(), channels_last)
    gets its pools rebuilt (Note [Pool views replaced], optimizer_state.py).
  * Sparse gradients (embedding(sparse=True)) never enter a pool: they are
    densified (sparse_as_dense=True, then pooled like the rest) or reduced
    by allgathering indices and values, as Horovod does. Which parameters
    go the sparse way is agreed by the ranks at step 1 and then fixed
    (Note [Sparse gradients agreed once] in optimizer_state.py): a rank
    without the gradient reduces an empty sparse one of the same layout; a
    parameter outside the set (an embedding no rank used in step 1) is
    reduced dense, its sparse gradients densified.
  * Frozen parameters (requires_grad=False at wrap time) are not reduced
    while frozen. Note [Late parameters]: a parameter of the optimizer that
    starts to require grad later (unfrozen for fine-tuning), and the
    trainable parameters of a group added by add_param_group() after
    wrapping (or put into a group by hand: Note [Parameters swapped in]
    in optimizer_state.py), are registered then and reduced like the others, on the copy
    path once the pool exists (its layout is fixed at step 1). Every rank
    must make the same change (add_param_group checks it; an unfreeze on
    some ranks only ends in Note [Bounded waits]'s error naming the tensor):
    otherwise their gradients would stay local and the ranks' parameters
    would silently drift apart (Horovod's optimizer ignores such
    parameters).
    Note [Frozen after wrapping]: a parameter frozen after wrapping
    (requires_grad=False at step time) still takes part in the reduction
    (zeros; the pool layout and the collectives stay the same on every rank,
    so no rank can wait for another), but its param.grad is None when the
    inner optimizer steps, so momentum and weight decay leave it where it
    is, as plain torch with zero_grad()'s default. Freeze before wrapping to
    save its traffic. A freeze on some ranks only fails the job on every
    rank at the next hyperparameter check, within 16 steps (Note [Frozen on
    some ranks] in hyperparameter_check.py): that rank's copy would stay put.
  * The wrapper shares param_groups and state with the optimizer it wraps,
    also across load_state_dict() (which torch would give new groups), so an
    LR scheduler made on either drives both.
  * The pool lives on CPU. With CUDA parameters the wrapper stays on the copy
    path, which stages through host memory (ran on a lent H100:
    tests/parallel/test_torch_cuda.py, docs/gpu.md).
"""
from __future__ import annotations

import contextlib
import sys
import warnings

import torch

from .. import _native, _runtime
from .. import monitor as _monitor
from .._runtime import ALLGATHER, ALLREDUCE, GradflowError
from .._withdrawal import reaching_core
from ..collectives import Average
from ..elastic import worker as _elastic_worker
from . import hyperparameter_check as _hyper_check
from . import optimizer_residual as _residual
from .functions import check_same_everywhere
from . import optimizer_step as _step
from .optimizer_groups import submit_group
from .complex_grads import real_grad
from .optimizer_state import rebind_after_elastic_reset, register_late_parameters
from .ops import allreduce, allreduce_async_, sparse_allreduce_async

__all__ = ["_DistributedOptimizer"]


def _as_sparse(grad: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """`grad` (dense, or sparse with other sparse dims) as a sparse COO
    tensor with `sparse_dim` sparse dimensions: the agreed layout."""
    return (grad.to_dense() if grad.is_sparse else grad).to_sparse(sparse_dim)


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a dynamic subclass of the user's optimizer class."""

    # ------------------------------------------------------------ late parameters
    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group. After wrapping, the group's trainable
        parameters are registered and reduced like the others (Note [Late
        parameters]; on the copy path once the pool exists). Collective
        then: every rank must add the same parameters (checked as at wrap
        time; a mismatch raises GradflowError on every rank)."""
        super(self.__class__, self).add_param_group(param_group)
        s = self.__dict__.get("_gradflow")
        if s is None:  # torch's own constructor, before gradflow's set-up
            return
        s.frozen.extend(p for p in self.param_groups[-1]["params"] if id(p) not in s.index)
        added = register_late_parameters(self)
        if _elastic_worker.current() is None:
            check_same_everywhere([(s.names[i], tuple(s.params[i].shape), str(s.params[i].dtype))
                                   for i in added],
                                  f"DistributedOptimizer '{s.prefix}' add_param_group",
                                  s.process_set)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, but the wrapper keeps its param_groups
        list, the group dicts and its state dict (updated in place): they
        are shared with the optimizer it wraps, and an LR scheduler made
        before wrapping holds that one. torch's version builds new groups,
        so after broadcast_optimizer_state() or a checkpoint restore the
        scheduler changed groups no step used any more (silently)."""
        groups, state = self.param_groups, self.state
        super(self.__class__, self).load_state_dict(state_dict)
        for old, new in zip(groups, self.param_groups):
            old.clear()
            old.update(new)
        state.clear()
        state.update(self.state)
        self.param_groups, self.state = groups, state

    # ------------------------------------------------------------ hooks
    def _gradflow_check_runtime(self) -> None:
        """After an elastic reset (a new runtime on a re-formed group) re-bind
        to the new runtime; outside elastic mode an optimizer of a previous
        runtime keeps failing with the core's clear error."""
        if (self._gradflow.runtime_gen != _runtime.generation()
                and _elastic_worker.current() is not None):
            rebind_after_elastic_reset(self)

    def _gradflow_hook(self, p: torch.Tensor) -> None:
        self._gradflow_check_runtime()
        s = self._gradflow
        if s.auto_synced:
            # A backward after the end-of-backward synchronization and no
            # step() (GradScaler skipped it on inf, say): that step is over.
            if s.op != Average:
                # Without zero_grad() the reduced gradients would be reduced
                # again: an average stays an average, a sum would not.
                raise GradflowError(
                    f"gradflow: {s.prefix}: a backward pass ran after this step's gradients were "
                    "reduced (when the last backward returned) and before step(); with "
                    f"op={s.op.name} they would be reduced twice. Call optimizer.zero_grad() "
                    "before the next backward, or raise backward_passes_per_step to accumulate "
                    "gradients locally")
            s.auto_synced = False
        if not s.fired:
            _step.begin_step_or_abandon(self)  # Note [A failed step] (optimizer_step.py)
        s.fired, s.synchronized = True, False
        if not s.callback_queued:  # Note [Reduced when backward returns]
            s.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._gradflow_backward_done)
        n = s.passes[id(p)] = s.passes.get(id(p), 0) + 1
        if n < s.bpps:
            return
        if n > s.bpps:
            raise GradflowError(
                f"gradflow: gradient of '{s.names[s.index[id(p)]]}' was computed {n} times before "
                f"step() but backward_passes_per_step={s.bpps}; raise backward_passes_per_step to "
                "accumulate gradients locally")
        s.complete += 1
        if not s.overlap:
            s.deferred.append(p)  # synchronize() submits, in this (backward) order
            return
        try:
            self._gradflow_submit(p)
        except BaseException as e:  # a user Compressor raising, an input the core refuses
            # Note [A failed step] (optimizer_step.py): autograd aborts this
            # backward, so the rest of the step would never be submitted here
            # while the other ranks wait for it. Fail it on every rank now.
            _step.abandon(self, e)
            raise

    def _gradflow_backward_done(self) -> None:
        """Runs when a backward pass that fired a hook returns (Note [Reduced
        when backward returns]): if every parameter got its last gradient of
        the step, or this was the step's last backward pass, wait for the
        reductions now, as DDP does (zeros for parameters without one)."""
        s = self._gradflow
        s.callback_queued = False
        if not s.fired:
            return
        # A reentrant backward (checkpoint(use_reentrant=True)) runs inside a
        # node of the outer one: its end is not the end of a pass, and the
        # outer pass's own hooks queue the callback again.
        nested = torch._C._current_autograd_node() is not None
        if not nested:
            s.passes_done += 1
        if s.complete == len(s.params) or (not nested and s.passes_done >= s.bpps):
            self.synchronize()
            s.synchronized, s.auto_synced = False, True

    def _gradflow_submit(self, p: torch.Tensor) -> None:
        s = self._gradflow
        if s.solo:
            # p.grad is the one-rank average; only sparse_as_dense applies
            if s.sparse_as_dense and p.grad.is_sparse:
                p.grad = p.grad.to_dense()
            s.handles[id(p)] = None  # submitted: synchronize() waits for nothing
            return
        i = s.index[id(p)]
        slot = s.range_of.get(id(p))
        if slot is not None:
            # p.grad replaced (e.g. model.zero_grad()): back into its view, one pass
            _residual.adopt(s, p, slot)
            h = _native.pool_mark_ready(s.pools[slot[0]].id, slot[1])
            s.marked.add(id(p))  # (after: a bucket whose mark raised never went out)
            if h >= 0:
                s.pool_handles.append(h)
            return
        if not s.pool_built and i not in s.order:
            s.order.append(i)
        grad = p.grad
        name = s.names[i]
        if not s.sparse_as_dense:  # Note [Sparse gradients agreed once] (optimizer_state.py)
            dim = s.sparse.get(i) if s.sparse_agreed else (grad.sparse_dim() if grad.is_sparse
                                                           else None)
            if dim is not None:
                if not s.sparse_agreed:
                    s.sparse[i] = min(dim, s.sparse.get(i, dim))
                # Answered for from here on: submitted, or withdrawn if it raises.
                s.answered.add(name)
                with reaching_core([name + ".indices", name + ".values"], ALLGATHER,
                                   s.process_set):
                    if not (grad.is_sparse and grad.sparse_dim() == dim):
                        p.grad = grad = _as_sparse(grad, dim)
                    s.handles[id(p)] = sparse_allreduce_async(grad, name, s.op, s.process_set)
                return
        if s.groups is not None:
            if grad.is_sparse:  # sparse_as_dense, or not agreed sparse: reduced dense
                p.grad = grad.to_dense()
            submit_group(s, i)  # (answers for the group's names once it goes out)
            return
        # Before the pool exists (step 1 of use_pool) the step is dense: a
        # residual under the parameter's name would never be delivered once
        # the pool's buckets take over (they own their residuals).
        ratio = 1.0 if s.use_pool else (None if s.sparse_ratio < 0 else s.sparse_ratio)
        s.answered.add(name)
        with reaching_core([name], ALLREDUCE, s.process_set):
            if grad.is_sparse:  # sparse_as_dense, or not agreed sparse: reduced dense
                p.grad = grad.to_dense()
            s.handles[id(p)] = allreduce_async_(
                real_grad(p), name=name, op=s.op, prescale_factor=s.prescale / s.loss_scale,
                postscale_factor=s.postscale * s.loss_scale, compression=s.compression,
                sparse_ratio=ratio, process_set=s.process_set, step_tag=s.step_tag,
                rollback_residual=s.rollback_residuals or name in s.rollback_names)

    # ------------------------------------------------------------ step protocol
    def synchronize(self) -> None:
        """Wait until every gradient of this step is reduced (submitting the
        ones no hook submitted). Raises GradflowError if no gradient was
        produced since the last step, or if a reduction failed; a failed
        step fails on every rank, and after zero_grad() the next step trains
        normally (Note [A failed step] in optimizer_step.py)."""
        self._gradflow_check_runtime()
        s = self._gradflow
        if s.auto_synced and not s.fired:  # done when backward returned
            s.synchronized = True
            return
        if not s.fired and _step.assigned_grads(s):
            # Note [Gradients assigned by hand]: no backward, but param.grad
            # set by the user (torch.autograd.grad, functorch, a gradient
            # computed by hand) since the last synchronize() / zero_grad():
            # reduced as Horovod's synchronize() does, those gradients and
            # zeros or the current param.grad for the others (no hook ran,
            # so the whole step is submitted here). Before, step() raised
            # "no backward pass produced a gradient" on every rank.
            _step.begin_step_or_abandon(self)  # Note [A failed step] (optimizer_step.py)
            s.fired, s.synchronized = True, False
        if not s.fired:
            # Note [No backward on one rank]: a rank that skipped backward
            # (e.g. `if torch.isfinite(loss): loss.backward()` on its own
            # loss) raised here alone while the others waited for its
            # buckets until GRADFLOW_TIMEOUT (60 s of stall, then a stall
            # error naming bucket0). Failed as Note [A failed step] does:
            # its names are withdrawn, so every rank's step fails at once
            # with this error and the next step pairs afresh.
            err = _step.no_gradient_error(s)
            _step.abandon(self, err)
            raise err
        _step.synchronize(self)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize: call synchronize()
        yourself first (gradient clipping, GradScaler.unscale_)."""
        s = self._gradflow
        s.should_sync = False
        try:
            yield
        finally:
            s.should_sync = True

    def step(self, closure=None):
        """Wait for this step's reductions (unless inside skip_synchronize()
        or synchronize() was already called), then run the wrapped step.
        With a closure (LBFGS), see Note [Closures]."""
        s = self._gradflow
        # No backward before step(): the closure's passes are reduced as they return.
        closure_runs_backward = closure is not None and not s.fired
        if closure is not None:
            closure = self._gradflow_closure(closure)
        if s.should_sync and not closure_runs_backward:
            if s.synchronized:
                # Horovod's wording first: scripts and Horovod's tests match on it.
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code. (gradflow: the reductions "
                              "are already done; not synchronizing again)")
            elif not s.auto_synced:
                self.synchronize()
        s.synchronized = s.auto_synced = False
        s.unapplied = False
        _monitor.count_step()  # for gradflowrun --monitor
        _hyper_check.count_step(s)  # Note [Steps per round]
        _hyper_check.note_caller(s, sys._getframe(1))  # Note [Loss scales agree]
        return super(self.__class__, self).step(closure)

    def _gradflow_closure(self, closure):
        """Note [Closures]: closure optimizers (LBFGS) call step(closure) with
        no backward before it; the closure zeroes, runs backward, returns the
        loss, maybe several times per step. Each of its backward passes is
        reduced when it returns (Note [Reduced when backward returns]); a
        pass that did not complete is waited for here. The loss it returns
        is averaged over the ranks (one scalar allreduce), because LBFGS
        branches on it (tolerance_change, the strong-Wolfe line search): a
        rank-local loss would make ranks take different branches, run
        different numbers of closures and drift apart or stall."""
        s = self._gradflow

        def reduced_closure():
            loss = closure()
            if s.fired:
                self.synchronize()
            if not isinstance(loss, torch.Tensor):
                return loss
            name = f"{s.prefix}.closure_loss"
            averaged = allreduce(loss.detach(), op=Average, name=name, process_set=s.process_set)
            return averaged.to(loss.dtype)

        return reduced_closure

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients. Pooled gradients are always zeroed in place
        (whatever `set_to_none` says) so they stay views of the pool; other
        gradients follow `set_to_none`. With CSC's residual in the pool
        (see DistributedOptimizer's sparse_ratio) nothing is zeroed: a
        pooled param.grad becomes the view of the pool again, which holds
        the residual (the gradient not sent yet), and backward adds to it:
        what backward added since the last step is not discarded."""
        self._gradflow_check_runtime()  # an elastic reset drops the pools first
        s = self._gradflow
        if s.callback_queued and torch._C._current_graph_task_id() == -1:
            _step.drop_interrupted(self)  # Note [A failed step]: a backward raised
        s.auto_synced = False  # a step reduced but not taken is over (GradScaler's skip)
        if not s.fired:  # (mid-step, the step's first hook already checked)
            _step.drop_stale_pools(self)  # Note [Pool views replaced] (optimizer_state.py)
        for pool in s.pools:
            if pool.out is None:
                pool.buf.zero_()
        _residual.point_at_pool(s)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                slot = s.range_of.get(id(p))
                if (slot is not None and not p.grad.is_sparse
                        and p.grad.data_ptr() == slot[2].data_ptr()):
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()
        _step.remember_grads(s)  # Note [Gradients assigned by hand]

    @property
    def wire_overflow(self) -> bool:
        """True if a 16-bit wire value overflowed in the last pooled step."""
        return self._gradflow.wire_overflow

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes accumulated locally per step (Horovod's attribute)."""
        return self._gradflow.bpps

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's method: from the next step on, accumulate `passes`
        backward passes per step, as the constructor argument does. Call it
        between steps (after step() or before the first backward): a change
        in the middle of an accumulation raises, since the passes already
        counted would be ambiguous. Local: every rank must set the same value."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"gradflow: backward_passes_per_step must be an int >= 1, got "
                             f"{passes!r}")
        s = self._gradflow
        if any(s.passes.values()):
            raise GradflowError("gradflow: set_backward_passes_per_step() called in the middle "
                                "of a step (backward passes already counted); call it after "
                                "step() or synchronize()")
        s.bpps = int(passes)
