# scatter_ops.py — torch reducescatter (with Horovod's pre/postscale) and the
# grouped allgather / reducescatter of Horovod 0.28, with their autograd
# gradients. Built on ops.py's staging helpers and grouped_ops.py's grouped
# handles (start_group, GroupHandle); the reduction and its scaling are the
# native core's.
"""Reducescatter and grouped allgather/reducescatter for ``import gradflow.torch as hvd``."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from .._handles import Handle
from .._runtime import ALLGATHER, REDUCESCATTER, auto_name, submit
from .._withdrawal import preparing
from ..collectives import Average, native_reduce_op
from .compression import Compression, split as split_compression
from ..process_sets import ProcessSet, global_process_set, process_set_size
from .grouped_ops import GroupHandle, grouped_allreduce_async, preparing_group, start_group
from .ops import _from_result, _op_of, _set_rank, _staged, allgather_async, dtype_code

__all__ = ["reducescatter", "reducescatter_async", "grouped_allgather", "grouped_allgather_async",
           "grouped_reducescatter", "grouped_reducescatter_async"]


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: int = Average,
                        process_set: Optional[ProcessSet] = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter: rank r gets block r of dim 0 of the reduction
    of `prescale_factor * tensor`, multiplied by `postscale_factor` (and by
    1/size for Average). Blocks are per member of `process_set` (default:
    all ranks), in set order. Scaling needs a floating-point tensor."""
    return _start_reducescatter(tensor, name, op, process_set, prescale_factor, postscale_factor)


def _start_reducescatter(tensor: torch.Tensor, name: Optional[str], op: int,
                         process_set: Optional[ProcessSet], prescale_factor: float,
                         postscale_factor: float, wire: int = -1) -> Handle:
    """reducescatter_async with a native wire code (-1: GRADFLOW_WIRE_DTYPE;
    1/2: float32 travels as fp16/bf16 and is summed in fp32, as allreduce's
    `compression=`). Horovod's async signature has no `compression`, so the
    synchronous forms reach the wire through here."""
    name = auto_name(REDUCESCATTER, name, process_set)
    with preparing(REDUCESCATTER, name, process_set):  # fails here: every rank fails `name`
        code = native_reduce_op(_op_of(None, op))  # (Note [Checks after naming])
        src = _staged(tensor)
        if src.dim() == 0:
            raise ValueError("gradflow: reducescatter needs a tensor with at least one dimension")
        dtype, device = src.dtype, tensor.device
        return submit(REDUCESCATTER, name, src.data_ptr(), 0, dtype_code(dtype), src.shape,
                      (src,), lambda r: _from_result(r, dtype, device), op=code, wire=wire,
                      prescale=prescale_factor, postscale=postscale_factor,
                      process_set=process_set)


class _ReducescatterFn(torch.autograd.Function):
    """Gradient: allgather of the incoming gradient, scaled as the forward
    (pre * post, and 1/size for Average), as in Horovod. `drawn`: the
    forward's name, drawn by the caller; `name`: the caller's (None: the
    gradient's allgather is auto-named)."""

    @staticmethod
    def forward(ctx, tensor, drawn, name, op, pre, post, process_set, wire):
        # op, pre and post are checked in there, once named (Note [Checks after naming])
        out = _start_reducescatter(tensor, drawn, op, process_set, pre, post, wire).wait()
        ctx.name, ctx.op, ctx.process_set = name, _op_of(None, op), process_set
        ctx.scale = float(pre) * float(post)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = None if ctx.name is None else ctx.name + ".grad"
        full = allgather_async(grad, g, ctx.process_set).wait()
        if ctx.op == Average:
            full = full / process_set_size(ctx.process_set, "reducescatter")
        if ctx.scale != 1.0:
            full = full * ctx.scale
        return full, None, None, None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: Any = Compression.none,
                  op: int = Average, process_set: Optional[ProcessSet] = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `prescale_factor * tensor` across ranks; this rank keeps its
    block of dim-0 rows (earlier ranks get the remainder), multiplied by
    `postscale_factor`. `compression=Compression.fp16/bf16` sends float32
    as 16 bits on the wire, each hop's partial sum added in fp32 (as
    allreduce's; Horovod casts the tensor to fp16 and sums in fp16); a user
    Compressor runs around the collective, as in Horovod. Differentiable
    (the gradient travels uncompressed, as in Horovod)."""
    drawn = auto_name(REDUCESCATTER, name, process_set)
    with preparing(REDUCESCATTER, drawn, process_set):  # fails here: every rank fails `drawn`
        wire, user = split_compression(compression)
        sent, cctx = user.compress(tensor) if user is not None else (tensor, None)
    out = _ReducescatterFn.apply(sent, drawn, name, op, prescale_factor, postscale_factor,
                                 process_set, wire)
    return user.decompress(out, cctx) if user is not None else out


# ---------------------------------------------------------------- grouped allgather, reducescatter

def _tensor_list(tensors: Sequence[torch.Tensor], what: str) -> List[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"gradflow: {what} takes a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    return list(tensors)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: Optional[ProcessSet] = global_process_set) -> GroupHandle:
    """Start an allgather of every tensor of the list (dim-0 sizes may differ
    between ranks, per tensor); `synchronize` returns the list of results."""
    tensors = _tensor_list(tensors, "grouped_allgather")
    return start_group(ALLGATHER, name, process_set, tensors,
                       lambda t, member: allgather_async(t, member, process_set))


class _GroupedAllgatherFn(torch.autograd.Function):
    """Per tensor, the gradient of allgather (see _AllgatherFn)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.name, ctx.process_set = name, process_set
        ctx.rows = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        return tuple(grouped_allgather_async(tensors, name, process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        g = None if ctx.name is None else ctx.name + ".grad"
        ps = ctx.process_set
        reduced = grouped_allreduce_async(grads, None, g, Average, process_set=ps).wait()
        rows = allgather_async(torch.tensor(ctx.rows, dtype=torch.int64).reshape(1, -1),
                               None if g is None else g + ".rows", ps).wait()
        offsets = rows[:_set_rank(ps)].sum(0).tolist()
        return (None, None) + tuple(r.narrow(0, int(o), n)
                               for r, o, n in zip(reduced, offsets, ctx.rows))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Optional[ProcessSet] = global_process_set) -> List[torch.Tensor]:
    """Allgather every tensor of the list (as `allgather`); differentiable."""
    tensors = _tensor_list(tensors, "grouped_allgather")
    return list(_GroupedAllgatherFn.apply(name, process_set, *tensors))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: int = Average,
                                process_set: Optional[ProcessSet] = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> GroupHandle:
    """Start a reducescatter of every tensor of the list (as
    `reducescatter_async`); `synchronize` returns the list of results."""
    return _start_grouped_reducescatter(tensors, name, op, process_set, prescale_factor,
                                        postscale_factor)


def _start_grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str], op: int,
                                 process_set: Optional[ProcessSet], prescale_factor: float,
                                 postscale_factor: float, wire: int = -1) -> GroupHandle:
    tensors = _tensor_list(tensors, "grouped_reducescatter")
    return start_group(REDUCESCATTER, name, process_set, tensors,
                       lambda t, member: _start_reducescatter(t, member, op, process_set,
                                                              prescale_factor, postscale_factor,
                                                              wire))


class _GroupedReducescatterFn(torch.autograd.Function):
    """Per tensor, the gradient of reducescatter (see _ReducescatterFn)."""

    @staticmethod
    def forward(ctx, args, base, *tensors):
        # `base`: the caller drew it; op, pre and post are checked once named
        ctx.args = args
        _name, op, ps, pre, post, wire = args
        return tuple(_start_grouped_reducescatter(tensors, base, op, ps, pre, post, wire).wait())

    @staticmethod
    def backward(ctx, *grads):
        name, op, ps, pre, post, _wire = ctx.args
        g = None if name is None else name + ".grad"
        scale = float(pre) * float(post) / (
            process_set_size(ps, "grouped_reducescatter") if _op_of(None, op) == Average else 1)
        full = grouped_allgather_async(grads, g, ps).wait()
        return (None, None) + tuple(f * scale if scale != 1.0 else f for f in full)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: Any = Compression.none, op: int = Average,
                          process_set: Optional[ProcessSet] = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reducescatter every tensor of the list (as `reducescatter`, with its
    `compression`; dim 0 of each is split separately). Differentiable."""
    tensors = _tensor_list(tensors, "grouped_reducescatter")
    base = auto_name(REDUCESCATTER, name, process_set)
    with preparing_group(REDUCESCATTER, base, len(tensors), process_set):
        wire, user = split_compression(compression)
        ctxs = None
        if user is not None:
            pairs = [user.compress(t) for t in tensors]
            tensors, ctxs = [p[0] for p in pairs], [p[1] for p in pairs]
    args = (name, op, process_set, prescale_factor, postscale_factor, wire)
    out = list(_GroupedReducescatterFn.apply(args, base, *tensors))
    return [user.decompress(o, c) for o, c in zip(out, ctxs)] if user is not None else out
