"""numpy collectives with Horovod's grammar: `allreduce`, `allreduce_async`,
`allgather`, `broadcast`, `reducescatter`, `alltoall`, `barrier`, `join`,
`synchronize`, `poll`. Every collective takes Horovod's `process_set=`
(None: all ranks), translated once in `_runtime.submit`. Arrays are made
C-contiguous and passed to the core by address (no copy for contiguous
native-order input; non-native byte order is swapped first); results are
new arrays in native byte order.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import ArrayLike

from . import _dtypes
from ._handles import Handle
from ._runtime import (ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, REDUCESCATTER,
                       GradflowError, advance_auto_names, auto_name, auto_name_counts, rank, submit)
from ._withdrawal import preparing
from .compression import wire_code
from .process_sets import ProcessSet
from .settings_check import native_sparse_ratio


class ReduceOp(enum.IntEnum):
    """Reduction operators, with Horovod's integer values (so a raw int means
    what it means in Horovod). The core's codes differ; `native_reduce_op`
    is the one place that translates."""

    Average = 0
    Sum = 1
    Adasum = 2  # scale-invariant pairwise combination (native/adasum_allreduce.h); allreduce only
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum,
                                           ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)

# ReduceOp -> native/common.h ReduceOp code (kSum=0, kAverage=1, kMin=2, kMax=3, kProduct=4,
# kAdasum=5).
_NATIVE_CODES = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4, Adasum: 5}


def reduce_op(op) -> ReduceOp:
    """`op` (a ReduceOp or a raw int with Horovod's meaning) as a ReduceOp.
    ValueError for an unknown value. Adasum is accepted here; the core
    refuses it at submit where it cannot run (a collective other than
    allreduce, a non-floating dtype, a rank count that is not a power of two,
    a 16-bit wire, sparse_ratio < 1), on every rank."""
    if op.__class__ is ReduceOp:  # the usual case, without the enum lookup
        return op
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)):
        raise ValueError(f"gradflow: unknown reduce op {op!r}; use Average, Sum, Adasum, Min, Max "
                         "or Product")
    try:
        return ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"gradflow: unknown reduce op {op!r}; use Average(0), Sum(1), Adasum(2), "
                         "Min(3), Max(4) or Product(5)") from None


def native_reduce_op(op) -> int:
    """The native core's code for `op` (validated by `reduce_op`)."""
    return _NATIVE_CODES[reduce_op(op)]


def check_adasum_options(op, wire: int, sparse_ratio: Optional[float], what: str) -> None:
    """For op=Adasum, refuse at construction what the core would refuse at
    the first allreduce: a 16-bit wire (`wire`: the native wire code of the
    caller's compression, -1 = setting default) or sparse_ratio < 1 (Adasum's
    dot products need every value as it is). No-op for other ops."""
    if reduce_op(op) != Adasum:
        return
    if wire > 0:
        raise ValueError(f"gradflow: {what}(op=Adasum) needs compression=Compression.none "
                         "(Adasum's dot products need the values as they are)")
    if sparse_ratio is not None and sparse_ratio < 1:
        raise ValueError(f"gradflow: {what}(op=Adasum) does not support sparse_ratio < 1")


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


def allreduce_async(array: ArrayLike, op: ReduceOp = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    compression: Any = None, sparse_ratio: Optional[float] = None,
                    process_set: Optional[ProcessSet] = None, *, step_tag: str = "") -> Handle:
    """Start an allreduce of `array` over `process_set` (default: all ranks);
    `synchronize(handle)` returns the reduced copy. `step_tag` (for
    framework bindings): names the set of allreduces submitted as one step;
    a rank submitting this name under another tag aborts the job with both
    tags (the ranks run different steps; native Note [Step tags])."""
    name = auto_name(ALLREDUCE, name, process_set)
    with preparing(ALLREDUCE, name, process_set):  # fails here: every rank fails `name`
        # Argument checks too (Note [Checks after naming] in _withdrawal.py).
        code = native_reduce_op(op)
        ratio = native_sparse_ratio(sparse_ratio, "allreduce")  # GRADFLOW_SPARSE_RATIO's limits
        wire = wire_code(compression)
        a = _prepare(array)
        out = np.empty_like(a)
        return submit(ALLREDUCE, name, a.ctypes.data, out.ctypes.data,
                      _dtypes.code_of_numpy(a.dtype), a.shape, (a, out), lambda r: out, op=code,
                      wire=wire, prescale=prescale_factor, postscale=postscale_factor,
                      sparse_ratio=ratio, process_set=process_set, step_tag=step_tag)


def allreduce(array: ArrayLike, op: ReduceOp = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              compression: Any = None, sparse_ratio: Optional[float] = None,
              process_set: Optional[ProcessSet] = None) -> np.ndarray:
    """Reduce `array` across the ranks of `process_set` (default: all ranks;
    Average divides by the set's size); every member gets the same,
    bitwise-identical result."""
    return allreduce_async(array, op, name, prescale_factor, postscale_factor, compression,
                           sparse_ratio, process_set).wait()


def allgather_async(array: ArrayLike, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = None) -> Handle:
    """Start an allgather; the first dimension may differ between ranks."""
    name = auto_name(ALLGATHER, name, process_set)
    with preparing(ALLGATHER, name, process_set):
        a = _prepare(array)
        if a.ndim == 0:
            a = a.reshape(1)
        return submit(ALLGATHER, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype), a.shape,
                      (a,), lambda r: _result_array(r, a.dtype), process_set=process_set)


def allgather(array: ArrayLike, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> np.ndarray:
    """Concatenate every member's `array` along the first dimension, in rank order."""
    return allgather_async(array, name, process_set).wait()


def root_rank_of(root_rank: Any) -> int:
    """`root_rank` as an int: a whole number (an int, a numpy integer, 1.0);
    ValueError for anything else. int() truncated 1.5 to 1 and took "1",
    so the broadcast came from another rank than asked, silently (Horovod's
    bindings refuse a float root)."""
    root = int(root_rank)
    if isinstance(root_rank, (str, bytes)) or root != root_rank:
        raise ValueError(f"gradflow: root_rank must be a whole rank number, got {root_rank!r}")
    return root


def broadcast_async(array: ArrayLike, root_rank: int, name: Optional[str] = None,
                    process_set: Optional[ProcessSet] = None) -> Handle:
    """Start a broadcast of root's `array`; the result is a new array.
    `root_rank` is a global rank (a member of `process_set`), as in Horovod."""
    name = auto_name(BROADCAST, name, process_set)
    with preparing(BROADCAST, name, process_set):
        root = root_rank_of(root_rank)
        a = _prepare(array)
        out = np.empty_like(a)
        return submit(BROADCAST, name, a.ctypes.data, out.ctypes.data,
                      _dtypes.code_of_numpy(a.dtype), a.shape, (a, out), lambda r: out,
                      root=root, process_set=process_set)


def broadcast(array: ArrayLike, root_rank: int, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> np.ndarray:
    """Root's `array` on every member (shapes and dtypes must match)."""
    return broadcast_async(array, root_rank, name, process_set).wait()


def reducescatter_async(array: ArrayLike, op: ReduceOp = Average, name: Optional[str] = None,
                        process_set: Optional[ProcessSet] = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        compression: Any = None) -> Handle:
    """Start a reducescatter: reduce `prescale_factor * array` across the
    members, rank r keeps block r of the first dimension, times
    `postscale_factor` (the core scales, as for allreduce). Parameter order
    as Horovod's reducescatter (process_set before the scale factors).
    `compression` selects the wire as for `allreduce` (Compression.fp16 /
    .bf16: float32 travels as 16 bits, each hop's partial sum added in fp32;
    None: the GRADFLOW_WIRE_DTYPE setting)."""
    name = auto_name(REDUCESCATTER, name, process_set)
    with preparing(REDUCESCATTER, name, process_set):
        code = native_reduce_op(op)
        wire = wire_code(compression)
        a = _prepare(array)
        if a.ndim == 0:
            raise ValueError("gradflow: reducescatter needs an array with at least one dimension")
        return submit(REDUCESCATTER, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype),
                      a.shape, (a,), lambda r: _result_array(r, a.dtype), op=code, wire=wire,
                      prescale=prescale_factor, postscale=postscale_factor,
                      process_set=process_set)


def reducescatter(array: ArrayLike, op: ReduceOp = Average, name: Optional[str] = None,
                  process_set: Optional[ProcessSet] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  compression: Any = None) -> np.ndarray:
    """Reduce `prescale_factor * array` across the members and return this
    rank's block of rows (one block per member in set order, rows split as
    evenly as possible, earlier ranks get the remainder), times
    `postscale_factor`. `compression` as for `reducescatter_async`."""
    return reducescatter_async(array, op, name, process_set, prescale_factor,
                               postscale_factor, compression).wait()


def alltoall_async(array: ArrayLike, splits: Optional[Sequence[int]] = None,
                   name: Optional[str] = None,
                   process_set: Optional[ProcessSet] = None) -> Handle:
    """Start an alltoall; the result is (array, received_splits)."""
    name = auto_name(ALLTOALL, name, process_set)
    with preparing(ALLTOALL, name, process_set):
        a = _prepare(array)
        if a.ndim == 0:
            a = a.reshape(1)
        given = [] if splits is None else list(splits)
        sp = [int(s) for s in given]
        if any(isinstance(g, (bool, np.bool_)) or s != g for s, g in zip(sp, given)):
            # int() truncated 1.5 to 1 and sent other rows than asked for
            raise ValueError(f"gradflow: alltoall splits must be whole row counts, got {given}")
        if any(s < 0 for s in sp):
            raise ValueError(f"gradflow: alltoall splits must be >= 0, got {sp}")
        return submit(ALLTOALL, name, a.ctypes.data, 0, _dtypes.code_of_numpy(a.dtype), a.shape,
                      (a,), lambda r: (_result_array(r, a.dtype),
                                       np.asarray(r["recv_splits"], np.int64)),
                      splits=sp, process_set=process_set)


def alltoall(array: ArrayLike, splits: Optional[Sequence[int]] = None, name: Optional[str] = None,
             process_set: Optional[ProcessSet] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Send `splits[p]` rows to member p (default: even split; one split per
    member of `process_set`, in set order); returns the rows received from
    every member in set order, and how many came from each."""
    return alltoall_async(array, splits, name, process_set).wait()


def barrier(process_set: Optional[ProcessSet] = None) -> None:
    """Block until every member of `process_set` (default: all ranks) reaches the barrier."""
    submit(BARRIER, auto_name(BARRIER, None, process_set), 0, 0, _dtypes.UINT8, [0], (),
           process_set=process_set).wait()


# Callbacks (no arguments) run after every join(): per-step counters that
# must agree across ranks start again there (the torch hyperparameter check's).
after_join: List[Callable[[], None]] = []

# Note [Join reports]: what a rank learned while others had joined reaches
# them with join() itself, at no extra traffic: each report's value() (an
# int >= 0) rides after the auto-name counts, and the core returns the
# maximum over ranks (as for the counts; a shorter list counts as zeros).
# check(maximum), after the after_join callbacks, may raise on every rank;
# note() is added to a failed join()'s error on this rank (a peer that ended
# while this rank was joined). The torch optimizer's sparse gradients use it
# (Note [Sparse gradients and join], gradflow/torch/sparse_join.py).
join_reports: List[Any] = []


def join() -> int:
    """Declare this rank done: until every rank has joined it contributes
    the op's identity to the other ranks' allreduces (zeros for sum and
    average, as Horovod; for min, max and product a value that changes
    nothing, where Horovod's zeros win) (any other collective submitted by
    the ranks still working fails on every rank with a clear error). Returns
    the rank that joined last, as Horovod does. Afterwards every rank's
    counters of auto-generated names agree again, so unnamed collectives
    match up even if some rank skipped some while it was joined."""
    from . import autotune  # imports this module: resolved at call time

    autotune.stop_for_join()  # the search needs every rank stepping
    name = auto_name(JOIN, None)
    counts, reports = auto_name_counts(), list(join_reports)
    try:
        r = submit(JOIN, name, 0, 0, _dtypes.UINT8, [0], (),
                   splits=counts + [int(rep.value()) for rep in reports]).wait()
    except GradflowError as e:  # Note [Join reports]
        notes = "".join(rep.note() for rep in reports)
        if notes:
            raise GradflowError(f"{e}{notes}") from e
        raise
    got = [int(v) for v in r["recv_splits"]]
    advance_auto_names(got[:len(counts)])
    for callback in after_join:
        callback()
    got += [0] * (len(counts) + len(reports) - len(got))
    for rep, maximum in zip(reports, got[len(counts):]):
        rep.check(maximum)
    return int(r["shape"][0])


# ---------------------------------------------------------------- objects
#
# Pickled objects travel as a header then the bytes. The header is int64
# [status, nbytes]: status 0, the bytes are the pickle; status 1, the object
# could not be pickled and the bytes are the error's text. A rank whose
# object fails to pickle still takes part in both collectives, so every rank
# learns of the failure at once and raises (the failing rank its own
# exception, the others a GradflowError quoting it), and the runtime stays
# usable: before, the failing rank raised alone and its peers waited in the
# header collective until GRADFLOW_TIMEOUT. Used by the torch and TensorFlow
# broadcast_object / allgather_object, each with its own pickler.

_PICKLED, _UNPICKLABLE = 0, 1
_MAX_ERROR_TEXT = 4096  # bytes of a pickling error's text sent to the peers


def _pickle_or_error(obj: Any, dumps: Callable[[Any], bytes]
                     ) -> Tuple[np.ndarray, Optional[Exception]]:
    """(obj pickled as uint8, None), or (the pickling error's text as uint8, the error)."""
    try:
        return np.frombuffer(dumps(obj), np.uint8), None
    except Exception as e:  # TypeError, PicklingError, AttributeError, RecursionError, ...
        text = f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:_MAX_ERROR_TEXT]
        return np.frombuffer(text or b"?", np.uint8), e


def _global_rank(process_set: Optional[ProcessSet], member: int) -> int:
    ranks = getattr(process_set, "ranks", None)
    return ranks[member] if ranks and getattr(process_set, "process_set_id", 0) else member


def broadcast_pickled(obj: Any, root_rank: int, size_name: str, data_name: str,
                      process_set: Optional[ProcessSet], dumps: Callable[[Any], bytes],
                      loads: Callable[[bytes], Any], what: str = "broadcast_object") -> Any:
    """Root's `obj` on every member of `process_set`, pickled with `dumps`
    (header broadcast `size_name`, bytes `data_name`); other ranks' `obj` is
    ignored. When root cannot pickle it, root re-raises its error and every
    other member raises GradflowError quoting it, all at once."""
    # The root checked once named (Note [Checks after naming]): bad on this
    # rank alone, every rank fails the header broadcast, the first the
    # others submit, instead of waiting for it until GRADFLOW_TIMEOUT.
    with preparing(BROADCAST, size_name, process_set):
        root = root_rank_of(root_rank)
    if rank() == root:
        data, err = _pickle_or_error(obj, dumps)
        head = np.array([_UNPICKLABLE if err is not None else _PICKLED, data.size], np.int64)
    else:
        data, err, head = None, None, np.zeros(2, np.int64)
    head = broadcast(head, root, name=size_name, process_set=process_set)
    if data is None:
        data = np.empty(int(head[1]), np.uint8)
    data = broadcast(data, root, name=data_name, process_set=process_set)
    if err is not None:
        raise err
    if int(head[0]) != _PICKLED:
        text = data.tobytes().decode("utf-8", "replace")
        raise GradflowError(f"gradflow: {what} '{size_name.rsplit('.', 1)[0]}': root rank {root} "
                            f"could not pickle its object ({text}); no rank received it")
    return obj if rank() == root else loads(data.tobytes())


def allgather_pickled(obj: Any, size_name: str, data_name: str,
                      process_set: Optional[ProcessSet], dumps: Callable[[Any], bytes],
                      loads: Callable[[bytes], Any], what: str = "allgather_object") -> List[Any]:
    """Every member's `obj` in set order, pickled with `dumps` (headers
    allgathered as `size_name`, bytes as `data_name`). When some member's
    object cannot be pickled, that member re-raises its error and every
    other member raises GradflowError naming it, all at once."""
    data, err = _pickle_or_error(obj, dumps)
    head = np.array([[_UNPICKLABLE if err is not None else _PICKLED, data.size]], np.int64)
    heads = allgather(head, name=size_name, process_set=process_set)
    gathered = allgather(data, name=data_name, process_set=process_set)
    offsets = np.concatenate([[0], np.cumsum(heads[:, 1])]).tolist()
    if err is not None:
        raise err
    failed = [i for i in range(len(heads)) if int(heads[i, 0]) != _PICKLED]
    if failed:
        i = failed[0]
        text = gathered[offsets[i]:offsets[i + 1]].tobytes().decode("utf-8", "replace")
        who = ", ".join(str(_global_rank(process_set, j)) for j in failed)
        raise GradflowError(f"gradflow: {what} '{size_name.rsplit('.', 1)[0]}': rank(s) {who} "
                            f"could not pickle their object (rank {_global_rank(process_set, i)}: "
                            f"{text}); no rank received the list")
    return [loads(gathered[offsets[i]:offsets[i + 1]].tobytes()) for i in range(len(heads))]


def synchronize(handle: Handle) -> Any:
    """Wait for an async handle and return its result."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True if the async handle has completed."""
    return handle.poll()
