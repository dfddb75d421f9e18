# ops.py — torch tensor collectives with Horovod's names (allreduce, allreduce_,
# allreduce_async, ..., synchronize, poll) and their autograd gradients; the
# grouped allreduce family is grouped_ops.py's, built on these.
# Owns only the tensor <-> raw-buffer translation; all communication is the
# native core's (through gradflow._runtime.submit, which also translates
# every `process_set=`, Horovod's last parameter). CUDA tensors are staged
# through a CPU copy (run on a GPU machine: docs/gpu.md, which also says why
# the copy is to pageable, not pinned, memory).
"""Tensor collectives for ``import gradflow.torch as hvd``."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch

from .. import _dtypes
from .._handles import Handle
from .._runtime import ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, auto_name, rank, submit
from ..collectives import (Average, ReduceOp, Sum, native_reduce_op, op_from_average, reduce_op,
                           root_rank_of)
from ..collectives import join as _np_join
from .._withdrawal import preparing
from .compression import Compression, split as _split_compression
from ..process_sets import ProcessSet, global_process_set, process_set_size
from ..settings_check import native_sparse_ratio

__all__ = [
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async",
    "sparse_allreduce_async", "synchronize", "poll", "join", "barrier",
]


# ---------------------------------------------------------------- helpers

_DTYPE_CODES: Dict[torch.dtype, int] = {}  # supported dtypes seen so far (per-call path)


def dtype_code(dtype: torch.dtype) -> int:
    """Native DataType code of a torch dtype (mapped by name; TypeError if unsupported)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = _dtypes.code_of_name(str(dtype).rsplit(".", 1)[-1])
    return code


def _op_of(average: Optional[bool], op: Optional[int]) -> ReduceOp:
    # Horovod's average=/op= rules and raw-int meaning (collectives.op_from_average).
    return op_from_average(average, op)


def _staged(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the same values: `tensor` itself when it
    already is one, else a copy (CUDA: device -> host into pageable memory;
    pinned staging measured slower from 16 MiB up, docs/gpu.md)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gradflow: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise TypeError("gradflow: sparse tensors go through sparse_allreduce_async")
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous()


def _set_rank(process_set: Optional[ProcessSet]) -> int:
    """This rank's index in `process_set` (its global rank for the global set)."""
    if process_set is None or process_set.process_set_id == 0:
        return rank()
    return process_set.rank()


def _bump_version(tensor: torch.Tensor) -> None:
    """Record an in-place write into `tensor` in its autograd version counter
    (shared with its views and `.detach()`), as torch's own in-place ops do,
    so a backward that saved `tensor` raises "modified by an inplace
    operation" instead of silently using the reduced values. Inference
    tensors have no counter."""
    if not tensor.is_inference():
        torch.autograd.graph.increment_version(tensor)


def _write_back(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Complete an in-place collective: the core wrote `src`; make `dst` hold
    it. Staged (non-contiguous or CUDA) `dst`: copy_, which bumps the version
    itself; zero-copy (`src` is `dst`'s memory): bump it here."""
    if src.data_ptr() != dst.data_ptr():
        with torch.no_grad():
            dst.copy_(src)
    else:
        _bump_version(dst)
    return dst


def _in_place(tensor: torch.Tensor) -> torch.Tensor:
    """`_staged(tensor)` for an in-place collective, which writes `tensor`
    from now until it completes: its version moves now, as when torch issues
    an in-place kernel (a backward run meanwhile raises), and again at
    completion (_write_back)."""
    buf = _staged(tensor)
    _bump_version(tensor)
    return buf


def _from_result(result: dict, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Wrap the core's byte result (numpy uint8) as a tensor without copying.
    An empty result (an allgather of 0 rows in all, a rank an alltoall or
    reducescatter gives nothing) is made afresh: torch refuses to view a
    0-byte uint8 tensor (stride 0) as a wider dtype."""
    shape = list(result["shape"])
    raw = torch.from_numpy(result["data"])
    t = torch.empty(shape, dtype=dtype) if raw.numel() == 0 else raw.view(dtype).reshape(shape)
    return t if device.type == "cpu" else t.to(device)


class SparseHandle:
    """A sparse allreduce in flight: allgathers of indices and values."""

    def __init__(self, indices: Handle, values: Handle, like: torch.Tensor, op: int, members: int):
        self.indices, self.values, self.like, self.op = indices, values, like, op
        self.members = members  # ranks of the process set: Average divides by it

    def poll(self) -> bool:
        return self.indices.poll() and self.values.poll()

    def wait(self) -> torch.Tensor:
        # Both are waited even when the first fails (a refusal while a rank
        # has joined fails both): the values allgather left in flight made
        # the next step's submission of its name fail ("submitted twice").
        try:
            idx = self.indices.wait()
        except BaseException:
            try:
                self.values.wait()
            except BaseException:  # noqa: BLE001 - the indices' error says it first
                pass
            raise
        val = self.values.wait()
        if self.op == Average:
            val = val / self.members
        out = torch.sparse_coo_tensor(idx.t(), val, self.like.shape, dtype=self.like.dtype,
                                      check_invariants=False).coalesce()
        return out.to(self.like.device)


# ---------------------------------------------------------------- allreduce

def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: Optional[ProcessSet] = global_process_set,
                     compression: Any = Compression.none, sparse_ratio: Optional[float] = None,
                     *, step_tag: str = "", rollback_residual: bool = False) -> Handle:
    """Start an in-place allreduce of `tensor` over `process_set`;
    `synchronize(handle)` returns it. A user Compressor compresses before and
    decompresses into `tensor` after. `step_tag`: the step this allreduce
    belongs to, which every rank must give alike (native Note [Step tags]).
    `rollback_residual` (with `sparse_ratio`): the name's CSC residual first
    goes back to before its last step (the DistributedOptimizer's skipped
    steps)."""
    name = auto_name(ALLREDUCE, name, process_set)
    with preparing(ALLREDUCE, name, process_set):  # fails here: every rank fails `name`
        # Argument checks too (Note [Checks after naming], gradflow/_withdrawal.py).
        code = native_reduce_op(_op_of(average, op))
        ratio = native_sparse_ratio(sparse_ratio, "allreduce")  # GRADFLOW_SPARSE_RATIO's limits
        wire, user = _split_compression(compression)
        if user is not None:
            sent, ctx = user.compress(tensor)
            buf = _staged(sent)
            _bump_version(tensor)
            finish = lambda r: _write_back(tensor, user.decompress(buf, ctx))  # noqa: E731
        else:
            buf = _in_place(tensor)
            finish = lambda r: _write_back(tensor, buf)  # noqa: E731
        return submit(ALLREDUCE, name, buf.data_ptr(), buf.data_ptr(), dtype_code(buf.dtype),
                      buf.shape, (buf, tensor), finish, op=code, wire=wire,
                      prescale=prescale_factor, postscale=postscale_factor, sparse_ratio=ratio,
                      process_set=process_set, step_tag=step_tag,
                      rollback_residual=rollback_residual)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: Optional[ProcessSet] = global_process_set,
                    compression: Any = Compression.none,
                    sparse_ratio: Optional[float] = None) -> Handle:
    """Start an allreduce over `process_set` into a new tensor;
    `synchronize(handle)` returns it. A user Compressor (Horovod's interface)
    compresses the input and decompresses the result, as Horovod's does."""
    name = auto_name(ALLREDUCE, name, process_set)
    with preparing(ALLREDUCE, name, process_set):
        code = native_reduce_op(_op_of(average, op))  # (Note [Checks after naming])
        ratio = native_sparse_ratio(sparse_ratio, "allreduce")  # GRADFLOW_SPARSE_RATIO's limits
        wire, user = _split_compression(compression)
        sent, ctx = user.compress(tensor) if user is not None else (tensor, None)
        src = _staged(sent)
        device = tensor.device
        out = torch.empty_like(src)

        def finish(r):
            res = out if device.type == "cpu" else out.to(device)
            return user.decompress(res, ctx) if user is not None else res

        return submit(ALLREDUCE, name, src.data_ptr(), out.data_ptr(), dtype_code(src.dtype),
                      src.shape, (src, out), finish, op=code, wire=wire,
                      prescale=prescale_factor, postscale=postscale_factor, sparse_ratio=ratio,
                      process_set=process_set)


class _AllreduceFn(torch.autograd.Function):
    """allreduce with a gradient: the gradient is the allreduce (same op and
    scaling) of the incoming gradient, as in Horovod."""

    @staticmethod
    def forward(ctx, tensor, name, average, op, pre, post, compression, process_set):
        # average= and op= are folded once named (Note [Checks after naming]).
        out = allreduce_async(tensor, average, name, op, pre, post, process_set,
                              compression=compression).wait()
        ctx.args = (name, _op_of(average, op), pre, post, compression, process_set)
        return out

    @staticmethod
    def backward(ctx, grad):
        name, op, pre, post, compression, process_set = ctx.args
        gname = None if name is None else name + ".grad"
        return (allreduce_async(grad, None, gname, op, pre, post, process_set,
                                compression=compression).wait(),
                None, None, None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Optional[ProcessSet] = global_process_set) -> torch.Tensor:
    """Reduce `tensor` across the ranks of `process_set` (default: all;
    default op: average over the set) into a new tensor, bitwise identical on
    every member; differentiable."""
    return _AllreduceFn.apply(tensor, name, average, op, prescale_factor, postscale_factor,
                              compression, process_set)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: Optional[ProcessSet] = global_process_set,
               compression: Any = Compression.none) -> torch.Tensor:
    """In-place allreduce over `process_set`; returns `tensor`."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set, compression=compression).wait()


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int = Average,
                           process_set: Optional[ProcessSet] = global_process_set) -> SparseHandle:
    """Allreduce of a sparse COO tensor as Horovod does it: allgather the
    indices and the values over `process_set`; the result (duplicates summed
    on coalesce) is divided by the set's size for Average. Only Sum and
    Average are meaningful."""
    op = reduce_op(op)
    if op not in (Sum, Average):
        raise ValueError(f"gradflow: sparse allreduce supports only Sum and Average, not {op.name}"
                         " (for Adasum pass sparse_as_dense=True to DistributedOptimizer)")
    t = tensor.detach().coalesce().cpu()
    idx = t.indices().t().contiguous()
    val = t.values().contiguous()
    members = process_set_size(process_set, "sparse_allreduce_async")
    return SparseHandle(allgather_async(idx, name + ".indices", process_set),
                        allgather_async(val, name + ".values", process_set), tensor, int(op),
                        members)


# ---------------------------------------------------------------- allgather

def allgather_async(tensor: torch.Tensor, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = global_process_set) -> Handle:
    """Start an allgather along dim 0 over `process_set` (sizes of dim 0 may
    differ between ranks)."""
    name = auto_name(ALLGATHER, name, process_set)
    with preparing(ALLGATHER, name, process_set):
        src = _staged(tensor)
        if src.dim() == 0:
            src = src.reshape(1)
        dtype, device = src.dtype, tensor.device
        return submit(ALLGATHER, name, src.data_ptr(), 0, dtype_code(dtype), src.shape, (src,),
                      lambda r: _from_result(r, dtype, device), process_set=process_set)


class _AllgatherFn(torch.autograd.Function):
    """Gradient as Horovod: average the incoming gradient over ranks, keep
    this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.name, ctx.process_set = name, process_set
        return allgather_async(tensor, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        g = None if ctx.name is None else ctx.name + ".grad"
        ps = ctx.process_set
        reduced = allreduce_async(grad, None, g, Average, process_set=ps).wait()
        rows = allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                               None if g is None else g + ".rows", ps).wait()
        offset = int(rows[:_set_rank(ps)].sum())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = global_process_set) -> torch.Tensor:
    """Concatenate every member's `tensor` along dim 0 in rank order; differentiable."""
    return _AllgatherFn.apply(tensor, name, process_set)


# ---------------------------------------------------------------- broadcast

def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = global_process_set) -> Handle:
    """Start an in-place broadcast of root's `tensor` (`root_rank` is a
    global rank, a member of `process_set`, as in Horovod)."""
    name = auto_name(BROADCAST, name, process_set)
    with preparing(BROADCAST, name, process_set):
        root = root_rank_of(root_rank)  # (Note [Checks after naming])
        buf = _in_place(tensor)
        return submit(BROADCAST, name, buf.data_ptr(), buf.data_ptr(), dtype_code(buf.dtype),
                      buf.shape, (buf, tensor), lambda r: _write_back(tensor, buf), root=root,
                      process_set=process_set)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = global_process_set) -> Handle:
    """Start a broadcast of root's `tensor` into a new tensor (`root_rank`: global)."""
    name = auto_name(BROADCAST, name, process_set)
    with preparing(BROADCAST, name, process_set):
        root = root_rank_of(root_rank)  # (Note [Checks after naming])
        src = _staged(tensor)
        device = tensor.device
        out = torch.empty_like(src)
        return submit(BROADCAST, name, src.data_ptr(), out.data_ptr(), dtype_code(src.dtype),
                      src.shape, (src, out), lambda r: out if device.type == "cpu" else out.to(device),
                      root=root, process_set=process_set)


class _BroadcastFn(torch.autograd.Function):
    """Gradient as Horovod: the averaged gradient on the root, zero elsewhere."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.name, ctx.process_set = root_rank, name, process_set
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        g = None if ctx.name is None else ctx.name + ".grad"
        reduced = allreduce_async(grad, None, g, Average, process_set=ctx.process_set).wait()
        if rank() != ctx.root:  # both global ranks
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = global_process_set) -> torch.Tensor:
    """Root's `tensor` on every member, as a new tensor; differentiable."""
    return _BroadcastFn.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Optional[ProcessSet] = global_process_set) -> torch.Tensor:
    """In-place broadcast; returns `tensor`."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
                   process_set: Optional[ProcessSet] = global_process_set) -> Handle:
    """Start an alltoall over `process_set` (one split per member); the
    result is (tensor, received_splits)."""
    name = auto_name(ALLTOALL, name, process_set)
    with preparing(ALLTOALL, name, process_set):  # splits may differ per rank: so may errors
        src = _staged(tensor)
        if src.dim() == 0:
            src = src.reshape(1)
        if torch.is_tensor(splits) and (splits.dtype.is_floating_point or splits.dtype.is_complex
                                        or splits.dtype == torch.bool):
            # Horovod: "alltoall expects splits to contain 32-bit integer elements"
            # (ValueError); gradflow also takes the other integer dtypes.
            raise ValueError(f"gradflow: alltoall splits must hold integers, got {splits.dtype}")
        sp = [] if splits is None else [int(s) for s in (splits.tolist() if torch.is_tensor(splits)
                                                          else splits)]
        if any(s < 0 for s in sp):
            raise ValueError(f"gradflow: alltoall splits must be >= 0, got {sp}")
        dtype, device = src.dtype, tensor.device
        return submit(ALLTOALL, name, src.data_ptr(), 0, dtype_code(dtype), src.shape, (src,),
                      lambda r: (_from_result(r, dtype, device),
                                 torch.tensor(list(r["recv_splits"]), dtype=torch.int32)),
                      splits=sp, process_set=process_set)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.name, ctx.process_set = name, process_set
        out, received = alltoall_async(tensor, splits, name, process_set).wait()
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        g = None if ctx.name is None else ctx.name + ".grad"
        back, _ = alltoall_async(grad, ctx.received, g, ctx.process_set).wait()
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits=None, name: Optional[str] = None,
             process_set: Optional[ProcessSet] = global_process_set
             ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Send `splits[p]` rows to member p of `process_set` (default: all
    ranks, even split). Returns the received rows in rank order, and (when
    `splits` is given) how many rows came from each rank, as Horovod does.
    Differentiable."""
    out, received = _AlltoallFn.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


# ---------------------------------------------------------------- control

def synchronize(handle) -> Any:
    """Wait for an async handle and return its result (the output tensor)."""
    return handle.wait()


def poll(handle) -> bool:
    """True if the async handle has completed."""
    return handle.poll()


def join(device: int = -1) -> int:
    """Declare this rank done: it contributes the op's identity (zeros for
    sum and average) to the other ranks' allreduces until every rank has
    joined (other collectives fail on every
    rank meanwhile). Returns the rank that joined last. `device` is accepted
    for Horovod compatibility (CPU only here)."""
    return _np_join()


def barrier(process_set: Optional[ProcessSet] = global_process_set) -> None:
    """Block until every member of `process_set` (default: all ranks) reaches the barrier."""
    submit(BARRIER, auto_name(BARRIER, None, process_set), 0, 0, _dtypes.UINT8, [0], (),
           process_set=process_set).wait()

