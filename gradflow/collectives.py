"""numpy collectives with Horovod's grammar: `allreduce`, `allreduce_async`,
`allgather`, `broadcast`, `reducescatter`, `alltoall`, `barrier`, `join`,
`synchronize`, `poll`. Arrays are made C-contiguous and passed to the core
by address (no copy for contiguous native-order input; non-native byte
order is swapped first); results are new arrays in native byte order.
"""
from __future__ import annotations

import enum
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import _dtypes
from ._handles import Handle
from ._runtime import (ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, REDUCESCATTER,
                       advance_auto_names, auto_name, auto_name_counts, size, submit)
from .compression import wire_code


class ReduceOp(enum.IntEnum):
    """Reduction operators, with Horovod's integer values (so a raw int means
    what it means in Horovod). The core's codes differ; `native_reduce_op`
    is the one place that translates."""

    Average = 0
    Sum = 1
    Adasum = 2  # Horovod's name; not implemented in gradflow (raises on use)
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum,
                                           ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)

# ReduceOp -> native/common.h ReduceOp code (kSum=0, kAverage=1, kMin=2, kMax=3, kProduct=4).
_NATIVE_CODES = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4}


def reduce_op(op) -> ReduceOp:
    """`op` (a ReduceOp or a raw int with Horovod's meaning) as a ReduceOp.
    ValueError for an unknown value; NotImplementedError for Adasum, which
    gradflow does not implement (never a silent fallback to another op)."""
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)):
        raise ValueError(f"gradflow: unknown reduce op {op!r}; use Average, Sum, Min, Max or Product")
    try:
        op = ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"gradflow: unknown reduce op {op!r}; use Average(0), Sum(1), Min(3), "
                         "Max(4) or Product(5)") from None
    if op == Adasum:
        raise NotImplementedError("gradflow: op=Adasum is not implemented in gradflow; use "
                                  "Average or Sum")
    return op


def native_reduce_op(op) -> int:
    """The native core's code for `op` (validated by `reduce_op`)."""
    return _NATIVE_CODES[reduce_op(op)]


def check_global_process_set(process_set, what: str) -> None:
    """Process sets are not implemented yet: accept only the default (None)
    or an object standing for Horovod's global set (process_set_id 0, or
    `ranks` listing every rank); anything else raises ValueError naming
    `what`, on every rank that passes it — never silently the global set."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return
    ranks = getattr(process_set, "ranks", None)
    if ranks is not None and sorted(int(r) for r in ranks) == list(range(size())):
        return
    raise ValueError(f"gradflow: {what}: process_set={process_set!r} is not supported; only the "
                     "global process set (all ranks, the default) is")


def op_from_average(average: Optional[bool], op) -> ReduceOp:
    """Horovod's deprecated `average=` folded into `op` (as Horovod's
    handle_average_backwards_compatibility): True -> Average, False -> Sum,
    neither given -> Average; both given -> ValueError."""
    if average is not None and op is not None:
        raise ValueError("gradflow: the op parameter supersedes average; pass only one of "
                         "average= (deprecated) and op=")
    if average is not None:
        if isinstance(average, ReduceOp):
            # A gradflow <= 0.x caller passing the op positionally where
            # Horovod's order has `average`: refuse rather than reinterpret.
            raise TypeError(f"gradflow: average= must be a bool, got {average!r}; pass the reduce "
                            "op as op=")
        return Average if average else Sum
    return reduce_op(Average if op is None else op)


def _prepare(array) -> np.ndarray:
    a = np.asarray(array)
    if not a.dtype.isnative:
        # Big-endian data (FITS, HDF5, ...): the core reduces native bytes,
        # so swap to native order here; results come back in native order.
        a = a.astype(a.dtype.newbyteorder("="))
    if not a.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
        a = np.ascontiguousarray(a)
    _dtypes.code_of_numpy(a.dtype)  # raises TypeError for unsupported dtypes
    return a


def _result_array(result: dict, dtype: np.dtype) -> np.ndarray:
    return result["data"].view(dtype).reshape(result["shape"])


def allreduce_async(array, op: ReduceOp = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    compression=None, sparse_ratio: Optional[float] = None) -> Handle:
    """Start an allreduce of `array`; `synchronize(handle)` returns the reduced copy."""
    code = native_reduce_op(op)  # before naming: a bad op leaves the name counters alone
    a = _prepare(array)
    out = np.empty_like(a)
    name = auto_name(ALLREDUCE, name)
    return submit(ALLREDUCE, name, a.ctypes.data, out.ctypes.data, _dtypes.code_of_numpy(a.dtype),
                  a.shape, (a, out), lambda r: out, op=code, wire=wire_code(compression),
                  prescale=prescale_factor, postscale=postscale_factor,
                  sparse_ratio=-1.0 if sparse_ratio is None else sparse_ratio)


def allreduce(array, op: ReduceOp = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              compression=None, sparse_ratio: Optional[float] = None) -> np.ndarray:
    """Reduce `array` across ranks (default: average); every rank gets the
    same, bitwise-identical result."""
    return allreduce_async(array, op, name, prescale_factor, postscale_factor, compression,
                           sparse_ratio).wait()


def allgather_async(array, name: Optional[str] = None) -> Handle:
    """Start an allgather; the first dimension may differ between ranks."""
    a = _prepare(array)
    if a.ndim == 0:
        a = a.reshape(1)
    name = auto_name(ALLGATHER, name)
    return submit(ALLGATHER, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype), a.shape, (a,),
                  lambda r: _result_array(r, a.dtype))


def allgather(array, name: Optional[str] = None) -> np.ndarray:
    """Concatenate every rank's `array` along the first dimension, in rank order."""
    return allgather_async(array, name).wait()


def broadcast_async(array, root_rank: int, name: Optional[str] = None) -> Handle:
    """Start a broadcast of root's `array`; the result is a new array."""
    a = _prepare(array)
    out = np.empty_like(a)
    name = auto_name(BROADCAST, name)
    return submit(BROADCAST, name, a.ctypes.data, out.ctypes.data, _dtypes.code_of_numpy(a.dtype),
                  a.shape, (a, out), lambda r: out, root=int(root_rank))


def broadcast(array, root_rank: int, name: Optional[str] = None) -> np.ndarray:
    """Root's `array` on every rank (shapes and dtypes must match)."""
    return broadcast_async(array, root_rank, name).wait()


def reducescatter_async(array, op: ReduceOp = Average, name: Optional[str] = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter: reduce `prescale_factor * array` across ranks,
    rank r keeps block r of the first dimension, times `postscale_factor`
    (the core scales, as for allreduce)."""
    code = native_reduce_op(op)
    a = _prepare(array)
    if a.ndim == 0:
        raise ValueError("gradflow: reducescatter needs an array with at least one dimension")
    name = auto_name(REDUCESCATTER, name)
    return submit(REDUCESCATTER, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype), a.shape,
                  (a,), lambda r: _result_array(r, a.dtype), op=code,
                  prescale=prescale_factor, postscale=postscale_factor)


def reducescatter(array, op: ReduceOp = Average, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce `prescale_factor * array` across ranks and return this rank's
    block of rows (rows split as evenly as possible, earlier ranks get the
    remainder), times `postscale_factor`."""
    return reducescatter_async(array, op, name, prescale_factor, postscale_factor).wait()


def alltoall_async(array, splits: Optional[Sequence[int]] = None, name: Optional[str] = None) -> Handle:
    """Start an alltoall; the result is (array, received_splits)."""
    a = _prepare(array)
    if a.ndim == 0:
        a = a.reshape(1)
    name = auto_name(ALLTOALL, name)
    sp = [] if splits is None else [int(s) for s in splits]
    if any(s < 0 for s in sp):
        raise ValueError(f"gradflow: alltoall splits must be >= 0, got {sp}")
    return submit(ALLTOALL, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype), a.shape, (a,),
                  lambda r: (_result_array(r, a.dtype), np.asarray(r["recv_splits"], np.int64)),
                  splits=sp)


def alltoall(array, splits: Optional[Sequence[int]] = None,
             name: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Send `splits[p]` rows to rank p (default: even split); returns the rows
    received from every rank in rank order, and how many came from each."""
    return alltoall_async(array, splits, name).wait()


def barrier() -> None:
    """Block until every rank reaches the barrier."""
    submit(BARRIER, auto_name(BARRIER, None), 0, 0, _dtypes.UINT8, [0], ()).wait()


def join() -> int:
    """Declare this rank done: until every rank has joined it contributes
    zeros to the other ranks' allreduces (any other collective submitted by
    the ranks still working fails on every rank with a clear error). Returns
    the rank that joined last, as Horovod does. Afterwards every rank's
    counters of auto-generated names agree again, so unnamed collectives
    match up even if some rank skipped some while it was joined."""
    name = auto_name(JOIN, None)
    r = submit(JOIN, name, 0, 0, _dtypes.UINT8, [0], (), splits=auto_name_counts()).wait()
    advance_auto_names(r["recv_splits"])
    return int(r["shape"][0])


def synchronize(handle: Handle):
    """Wait for an async handle and return its result."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True if the async handle has completed."""
    return handle.poll()
