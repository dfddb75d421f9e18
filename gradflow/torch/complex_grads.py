# complex_grads.py — how the torch DistributedOptimizer hands a complex
# parameter's gradient to the core, which reduces real dtypes only: as its
# view_as_real, in place; and how the whole-model broadcasts (functions.py)
# send complex parameters and optimizer state. No communication here.
"""Complex tensors for gradflow.torch's optimizer and helpers (Note [Complex gradients])."""
import torch


# Note [Complex gradients]
# ------------------------
# The core reduces real dtypes only. A complex parameter's gradient is
# reduced as its view_as_real (pairs of floats, in its own memory): Sum and
# Average of complex numbers are those of their real and imaginary parts, as
# DDP does it. In a pool it takes 2 * numel elements of the pool of its real
# dtype, and param.grad is a view_as_complex of that range. Before
# (2026-11-28, found by a helper's combination audit): the first backward
# raised TypeError "unsupported dtype complex64" inside autograd on every
# rank and the optimizer could not go on.


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the core reduces for a gradient of `dtype` (complex64 -> float32)."""
    return dtype.to_real() if dtype.is_complex else dtype


def real_grad(p: torch.Tensor) -> torch.Tensor:
    """p.grad as the core reduces it: itself, or a complex gradient's
    view_as_real (Note [Complex gradients]). A lazily conjugated or negated
    complex gradient is resolved into p.grad first, so the reduction writes
    into p.grad's own memory."""
    g = p.grad
    if not g.is_complex() or g.is_sparse:
        return g
    if g.is_conj() or g.is_neg():
        p.grad = g = g.resolve_conj().resolve_neg()
    return torch.view_as_real(g)


def broadcast_view(t: torch.Tensor, root: bool) -> torch.Tensor:
    """`t` as the in-place broadcast of broadcast_parameters /
    broadcast_optimizer_state sends or receives it: itself, or a complex
    tensor's view_as_real (its own memory). Root only reads, so a lazily
    conjugated or negated tensor is resolved into a copy there; a receiving
    one must be plain (else the result could not land in its memory)."""
    if not t.is_complex():
        return t
    if t.is_conj() or t.is_neg():
        if not root:
            raise ValueError("gradflow: cannot broadcast into a lazily conjugated or negated "
                             "complex tensor; call resolve_conj() / resolve_neg() on it first")
        t = t.resolve_conj().resolve_neg()
    return torch.view_as_real(t)
