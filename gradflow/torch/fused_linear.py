# fused_linear.py — gradient-accumulation fusion for nn.Linear: the weight
# gradient GEMM accumulates straight into an existing `weight.grad` (with
# DistributedOptimizer's pool, that is the pool view) instead of producing a
# fresh tensor that autograd then adds in. Pure torch: no communication.
"""Weight-gradient accumulation fusion for ``torch.nn.Linear`` (opt-in).

Without it, autograd computes each weight gradient into a fresh tensor
(for a 4096x4096 layer: a new 64 MiB allocation, page-faulted in on every
step) and AccumulateGrad then adds it into ``weight.grad`` when that already
exists: one more full read-read-write pass over the gradient. With
DistributedOptimizer's gradient pool ``weight.grad`` always exists (a view
of the pool; with CSC the pool also holds the residual), so the pool path
paid both on every step (docs/performance.md, "Where the last 15 % go").

``FusedLinear`` computes the weight gradient as one GEMM with beta = 1 into
``weight.grad`` (``addmm_``), as Megatron-LM's gradient-accumulation fusion
does, and hands autograd no weight gradient; autograd still runs the
parameter's AccumulateGrad node, so ``register_post_accumulate_grad_hook``
hooks (DistributedOptimizer's readiness hook among them) fire as before,
once per backward, after every contribution to the weight is in.

Same semantics as autograd: autograd also accumulates in place into an
existing ``.grad`` (first-order backward). The sum may differ from the
unfused one in the last bits (one fused GEMM instead of GEMM + add);
training is deterministic and DistributedOptimizer's reduced values are
identical on all ranks either way.

Tested with plain torch and with gradflow's DistributedOptimizer (pool and
copy paths, CSC, AMP, tied weights). With torch's DistributedDataParallel
(whose reducer hooks AccumulateGrad itself) only a check by hand: 2 gloo
processes, 5 SGD steps, gradient_as_bucket_view on and off, the same
parameters as with nn.Linear; not in the test suite.

The fused path is taken only when it means the same thing; otherwise the
layer computes exactly what nn.Linear computes:
  * ``weight.grad`` exists, is dense, contiguous, of the weight's shape,
    dtype and device (step 1 of DistributedOptimizer has no pool yet, and
    ``zero_grad(set_to_none=True)`` outside a gradflow optimizer drops it);
  * first-order backward (``create_graph=False``) that accumulates into
    the weight's ``.grad`` at all: ``loss.backward()``, or ``backward(inputs=
    ...)`` naming the weight; not ``torch.autograd.grad()``, which returns
    gradients and must leave ``.grad`` alone;
  * no ``weight.register_hook()`` hook (it must see, and may change, the
    weight's gradient before accumulation);
  * autocast is off at forward time (mixed dtypes: plain F.linear).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.graph import get_gradient_edge

__all__ = ["FusedLinear", "fuse_linear_grad_accumulation"]


def _engine_accumulates(weight: torch.Tensor) -> bool:
    """Whether this backward runs the weight's AccumulateGrad node, i.e.
    writes weight.grad. torch.autograd.grad() never does (torch raises for a
    leaf's node there); a private torch call, so anything unexpected means
    "no" and the layer computes a plain gradient."""
    try:
        return bool(torch._C._will_engine_execute_node(get_gradient_edge(weight).node))
    except (RuntimeError, AttributeError):
        return False


def _fusable(weight: torch.Tensor, grad_out: torch.Tensor) -> bool:
    g = weight.grad
    return (g is not None and not torch.is_grad_enabled() and g.layout == torch.strided
            and g.dtype == grad_out.dtype and g.device == grad_out.device
            and g.shape == weight.shape and g.is_contiguous() and not g.requires_grad
            and not weight._backward_hooks  # register_hook() hooks see the gradient
            and _engine_accumulates(weight))


class _LinearAccumulateWeightGrad(torch.autograd.Function):
    """y = x W^T + b; backward accumulates dL/dW into W.grad when it can."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_out.matmul(weight)
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, x.shape[-1])
            if _fusable(weight, grad_out):
                weight.grad.addmm_(g2.t(), x2)  # dL/dW += g^T x, one GEMM, beta = 1
            else:
                grad_w = g2.t().mm(x2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


class FusedLinear(nn.Linear):
    """nn.Linear whose weight gradient accumulates in place into an existing
    ``weight.grad`` (see the module docstring). Same parameters, state_dict
    and forward values as nn.Linear; a drop-in replacement."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not self.weight.requires_grad or not torch.is_grad_enabled()
                or torch.is_autocast_enabled(x.device.type)):
            return F.linear(x, self.weight, self.bias)
        return _LinearAccumulateWeightGrad.apply(x, self.weight, self.bias)


def fuse_linear_grad_accumulation(module: nn.Module) -> nn.Module:
    """Turn every plain ``nn.Linear`` inside `module` (itself included) into a
    FusedLinear, in place (the class is swapped: parameters, hooks and
    state_dict stay as they are), and return `module`. Subclasses of
    nn.Linear (own forward, parametrizations, adapters) are left alone.
    Call it before or after wrapping the optimizer; it matters only where
    ``weight.grad`` already exists at backward, as with
    DistributedOptimizer's gradient pool."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = FusedLinear
    return module
