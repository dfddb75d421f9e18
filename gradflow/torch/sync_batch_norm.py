# gradflow/torch/sync_batch_norm.py — SyncBatchNorm for PyTorch (Horovod's
# horovod.torch.SyncBatchNorm): batch norm whose training statistics are those
# of the global batch (all ranks' local batches together). Owns the per-channel
# statistics math and its autograd; the two collectives it needs (an allreduce
# of per-rank moments in forward, an allreduce of two gradient sums in
# backward) are gradflow.torch ops, so no communication logic lives here.
"""``SyncBatchNorm``: batch normalization over the global batch (``hvd.SyncBatchNorm``).

Semantics
---------
* Training (or ``track_running_stats=False``) on more than one rank: every
  rank normalizes with the mean and biased variance of the *global* batch —
  the concatenation of all ranks' local batches, which may differ in size
  (a rank's local batch may even be empty). ``running_mean``/``running_var``
  are updated exactly as ``torch.nn.BatchNorm*d`` would on the global batch
  (unbiased global variance), so they stay identical on every rank.
* Eval mode with running statistics, or a single rank: plain
  ``F.batch_norm`` (no communication), as in Horovod.
* Gradients: the input gradient on rank r is d(sum over ranks of their
  losses)/d(x_r), i.e. rank r's rows of the gradient a single process would
  compute on the global batch with loss = sum of the ranks' losses. The
  weight/bias gradients are *local* (this rank's share); their sum over
  ranks is the single-process gradient. ``DistributedOptimizer`` averages
  gradients, so every parameter (BN and upstream) then moves along the
  gradient of the mean of the ranks' losses — consistent across layers.

* ``join()``: a rank that joined counts as an empty local batch (Note
  [SyncBatchNorm under join]); Horovod's layer (an allgather) fails there.

Unlike Horovod's, CPU tensors are supported (Horovod's needs CUDA kernels);
statistics are combined in float64, in rank order, so every rank computes
bitwise the same mean/variance. Calls are synchronous: every rank must run
the layer's forward (and backward) in the same order, as for any collective.

``process_set=`` (a gradflow extra, as torch's ``process_group=``): the
global batch is that of the set's members only, and only they communicate.
Models trained on disjoint process sets need it: with the default (all
ranks) their layers' statistics were pooled across the sets, silently, or,
when only one set's model has the layer, its members waited on the others
until those shut down (found by the 2026-11-28 combination audit).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..collectives import Sum
from ..process_sets import (ProcessSet, global_process_set, member_id, process_set_rank,
                            process_set_size)
from .ops import allreduce_async

__all__ = ["SyncBatchNorm"]


def _reduce_dims(x: torch.Tensor):
    return [0] + list(range(2, x.dim()))


def _channel_view(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-channel vector shaped to broadcast against (N, C, *) input."""
    return v.reshape([1, -1] + [1] * (x.dim() - 2))


def _global_moments(x: torch.Tensor, name: str, process_set: Optional[ProcessSet]):
    """(count, mean, biased var, unbiased var) per channel over all ranks'
    inputs, as float64. Each rank sends (n, local mean, local sum of squared
    deviations); the combination (Chan et al.) avoids E[x^2]-E[x]^2
    cancellation and runs on identical gathered data in rank order, so the
    result is bitwise the same on every rank."""
    c = x.shape[1]
    n = x.numel() // c if c else 0
    acc = torch.promote_types(x.dtype, torch.float32)
    if n > 0:
        xa = x.to(acc)
        dims = _reduce_dims(x)
        mean = xa.mean(dims)
        m2 = (xa - _channel_view(mean, x)).square().sum(dims)
    else:  # an empty local batch contributes nothing (but still takes part)
        mean = torch.zeros(c, dtype=acc)
        m2 = torch.zeros(c, dtype=acc)
    # Note [SyncBatchNorm under join]: each rank fills its own row of a
    # (ranks, 3, C) tensor and the rows are summed: every other term is an
    # exact zero, so this is the allgather it replaces, bit for bit. A rank
    # that called join() contributes zeros, i.e. an empty local batch, so
    # the ranks still training normalize over their own global batch (an
    # allgather cannot run while a rank has joined: the layer raised there,
    # on the training ranks only, while the joined ranks' join() returned).
    every = torch.zeros(process_set_size(process_set, "SyncBatchNorm"), 3, c,
                        dtype=torch.float64)
    every[process_set_rank(process_set, "SyncBatchNorm")] = torch.stack(
        [torch.full((c,), float(n), dtype=torch.float64), mean.double().cpu(), m2.double().cpu()])
    every = allreduce_async(every, name=name, op=Sum, process_set=process_set).wait()
    counts, means, m2s = every[:, 0], every[:, 1], every[:, 2]
    total = counts[:, 0].sum()
    if total <= 1:
        # the same decision on every rank (same gathered counts): no hang
        raise ValueError("SyncBatchNorm: expected more than 1 value per channel when training "
                         f"(global batch has {int(total)}, input size {list(x.shape)} here)")
    g_mean = (counts * means).sum(0) / total
    g_m2 = m2s.sum(0) + (counts * (means - g_mean).square()).sum(0)
    return total, g_mean, g_m2 / total, g_m2 / (total - 1)


class _SyncBatchNormFn(torch.autograd.Function):
    """Global-batch normalization with its exact gradient (see module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, name,
                process_set):
        x = x.contiguous()
        total, g_mean, g_var, g_var_unbiased = _global_moments(x, name + ".stats", process_set)
        if running_mean is not None:  # torch's update: unbiased variance, in place
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean), alpha=momentum)
                running_var.mul_(1 - momentum).add_(g_var_unbiased.to(running_var),
                                                    alpha=momentum)
        acc = torch.promote_types(x.dtype, torch.float32)
        mean = g_mean.to(device=x.device, dtype=acc)
        invstd = torch.rsqrt(g_var + eps).to(device=x.device, dtype=acc)
        xhat = (x.to(acc) - _channel_view(mean, x)) * _channel_view(invstd, x)
        y = xhat
        if weight is not None:
            y = y * _channel_view(weight.to(acc), x)
        if bias is not None:
            y = y + _channel_view(bias.to(acc), x)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total = float(total)
        ctx.name, ctx.process_set = name, process_set
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        acc = mean.dtype
        dims = _reduce_dims(x)
        dya = dy.contiguous().to(acc)
        xhat = (x.to(acc) - _channel_view(mean, x)) * _channel_view(invstd, x)
        if x.numel() > 0:
            sum_dy = dya.sum(dims)
            sum_dy_xhat = (dya * xhat).sum(dims)
        else:
            sum_dy = torch.zeros_like(mean)
            sum_dy_xhat = torch.zeros_like(mean)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        if need_x:
            # The global statistics depend on every rank's input, so each
            # rank's input gradient needs the global sums of dy and dy*xhat.
            both = torch.stack([sum_dy, sum_dy_xhat]).double().cpu()
            g = allreduce_async(both, name=ctx.name + ".grad", op=Sum,
                                process_set=ctx.process_set).wait()
            g = (g / ctx.total).to(device=x.device, dtype=acc)
            scale = invstd if weight is None else invstd * weight.to(acc)
            grad_x = (_channel_view(scale, x) * (dya - _channel_view(g[0], x)
                                                  - xhat * _channel_view(g[1], x))).to(x.dtype)
        if weight is not None and need_w:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and need_b:
            grad_b = sum_dy.to(weight.dtype if weight is not None else x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of all ranks (Horovod's
    ``hvd.SyncBatchNorm``; input ``(N, C, *)``, any number of spatial dims).

    Arguments are those of ``torch.nn.BatchNorm2d``: ``num_features`` (C),
    ``eps``, ``momentum`` (None: cumulative average), ``affine``,
    ``track_running_stats``. Local batch sizes may differ between ranks.
    Every rank must call forward/backward of its SyncBatchNorm layers in the
    same order (they communicate). See the module docstring for gradients.
    ``process_set`` (keyword only; default all ranks): the ranks whose local
    batches make the global batch; only its members may run the layer in
    training mode (others raise ValueError there, before communicating).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 process_set: Optional[ProcessSet] = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        if process_set is not None and not isinstance(process_set, ProcessSet):
            raise ValueError("gradflow: SyncBatchNorm: process_set must be a gradflow.ProcessSet "
                             f"(or None for all ranks), got {process_set!r}")
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm: expected at least 2D input "
                             f"(got {input.dim()}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: expected {self.num_features} channels (dim 1), "
                             f"got input of size {list(input.shape)}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # getattr: a module pickled before process_set existed has none (all ranks)
        ps = getattr(self, "process_set", global_process_set)
        if use_batch_stats:  # a non-member raises here, before communicating or counting
            member_id(ps, "SyncBatchNorm")
        # Momentum and the batch counter exactly as torch's _BatchNorm.forward.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        if not use_batch_stats or process_set_size(ps, "SyncBatchNorm") == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        # Names depend on the channel count only, so layers of equal width
        # share one cached negotiation; calls are synchronous, never two in flight.
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, running_mean, running_var,
                                      self.eps, factor, f"sync_batch_norm.{self.num_features}", ps)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: Optional[ProcessSet] = global_process_set
                               ) -> torch.nn.Module:
        """Return `module` with every ``torch.nn.BatchNorm*d`` (any ``_BatchNorm``
        that is not already a SyncBatchNorm) replaced by a SyncBatchNorm holding
        the same parameters, buffers, training flag and requires_grad, over
        `process_set` (as ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``
        with its ``process_group``; not in Horovod)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for child_name, child in module.named_children():
            out.add_module(child_name, cls.convert_sync_batchnorm(child, process_set))
        return out
