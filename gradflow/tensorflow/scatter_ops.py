# gradflow/tensorflow/scatter_ops.py — TensorFlow reducescatter (Horovod's
# signature, with pre/postscale) and Horovod 0.28's grouped allgather /
# reducescatter, each differentiable. Built on ops.py's crossing (`_cross`) and
# names; the reduction, its scaling and the gathering are the native core's.
"""`reducescatter`, `grouped_reducescatter`, `grouped_allgather` for
`import gradflow.tensorflow as hvd` (eager and inside tf.function).

A grouped op submits every tensor before waiting on any (one host crossing),
so the core can run them back to back; tensor i of a group is named
`<name>.<i>`. Arguments are checked once the op is named, as in ops.py
(arguments.Checked): one bad on one rank fails the op on every rank.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from .. import collectives as _c
from .._handles import wait_all
from .._runtime import ALLGATHER, REDUCESCATTER, submitting_group
from ..collectives import Average, ReduceOp, Sum, reduce_op
from ..compression import Compression, wire_code
from ..process_sets import (ProcessSet, global_process_set, process_set_id, process_set_rank,
                            process_set_size)
from .arguments import Checked, converted
from .crossing import empty_group
from .ops import (TensorLike, _allgather, _check_dtype, _cross, allreduce,
                  gathered_shape, op_name, own_rows)

__all__ = ["reducescatter", "grouped_reducescatter", "grouped_allgather"]


def _scattered_shape(x: tf.Tensor, process_set: Optional[ProcessSet]
                     ) -> Optional[List[Optional[int]]]:
    """Static shape of this rank's block: rows split as evenly as possible
    over the members of `process_set`, earlier members get the remainder (the
    core's split)."""
    if not x.shape.rank:  # (rank 0: refused by the checks, at run time when traced)
        return None
    n = x.shape[0]
    members = process_set_size(process_set, "reducescatter")
    me = process_set_rank(process_set, "reducescatter")
    rows = None if n is None else n // members + (1 if me < n % members else 0)
    return [rows] + list(x.shape[1:])


def _input_list(tensors: Sequence[TensorLike], what: str) -> List[TensorLike]:
    """The list itself checked; its values are converted once named (converted())."""
    if isinstance(tensors, (tf.Tensor, tf.Variable)) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"gradflow: {what} takes a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    return list(tensors)


def _check_inputs(xs: Sequence[tf.Tensor], what: str) -> None:
    for x in xs:
        _check_dtype(x, what)
        if what.endswith("reducescatter") and x.shape.rank == 0:
            raise ValueError(f"gradflow: {what} needs tensors with at least one dimension")


def _check_scatter(xs: Sequence[tf.Tensor], device_dense: Any, compression: Any, op: Any,
                   pre: Any, post: Any, what: str) -> Tuple[ReduceOp, float]:
    """A reducescatter's checks; (op, the gradient's scale pre * post)."""
    _check_device(device_dense, what)
    wire_code(compression)
    _check_inputs(xs, what)
    return reduce_op(op), float(pre) * float(post)


def _reducescatter_grad(dys: Sequence[tf.Tensor], names: Sequence[str], op: ReduceOp,
                        scale: float, process_set: Optional[ProcessSet],
                        what: str) -> List[tf.Tensor]:
    # y_r = post * op_j(pre * x_j)[block r]: d y_r / d x_j[block r] is
    # pre * post (and 1/members for Average), so member j's gradient is the
    # allgather of every member's upstream block, scaled. (gradflow.torch's
    # convention; Horovod multiplies Sum's gradient by size instead.)
    def check():
        if op not in (Sum, Average):
            raise NotImplementedError(f"gradflow: no gradient for {what} with op {op!r}")

    # Each gradient is its own crossing: the first one fails, the others never run.
    first = Checked(check, ALLGATHER, [f"{names[0]}.grad"], process_set)
    members = process_set_size(process_set, "reducescatter")
    out = []
    for i, (dy, name) in enumerate(zip(dys, names)):
        g = _allgather(tf.convert_to_tensor(dy), f"{name}.grad", process_set,
                       first if i == 0 else Checked(lambda: None, ALLGATHER, []))
        factor = scale / members if op == Average else scale
        out.append(g if factor == 1.0 else g * tf.cast(factor, g.dtype))
    return out


def _scatter(xs: List[tf.Tensor], names: List[str], checked: Checked, pre: Any, post: Any,
             process_set: Optional[ProcessSet], what: str, compression: Any,
             grouped: bool) -> List[tf.Tensor]:
    """The differentiable grouped reducescatter under both public forms
    (`checked`: its arguments' checks, _check_scatter; `compression` picks
    the wire; the gradient travels uncompressed; `grouped`: a user's list,
    one grouped op: _runtime.submitting_group)."""
    op, scale = checked.value if checked.ok else (Sum, 1.0)  # (traced: the node raises first)

    @tf.custom_gradient
    def _fn(*xs):
        def fn(*arrays):
            checked.get()
            with submitting_group(len(arrays) if grouped else 0, names, REDUCESCATTER,
                                  process_set):
                handles = [_c.reducescatter_async(a, op, n, process_set, pre, post, compression)
                           for a, n in zip(arrays, names)]
            return wait_all(handles)

        ys = _cross(fn, list(xs), [x.dtype for x in xs],
                    [_scattered_shape(x, process_set) for x in xs],
                    f"{what} {names[0]!r}")

        def grad(*dys):
            return _reducescatter_grad(dys, names, op, scale, process_set, what)

        return ys, grad

    return list(_fn(*xs))


def _check_device(device_dense: Any, what: str) -> None:
    # Horovod's second positional parameter is device_dense (a string); an op
    # passed there (gradflow's old `reducescatter(tensor, op)`) must not be
    # silently taken for a device.
    if not isinstance(device_dense, str):
        raise TypeError(f"gradflow: {what}: device_dense must be a string (Horovod's positional "
                        f"order), got {device_dense!r}; pass the reduce op as op=")


def reducescatter(tensor: TensorLike, device_dense: str = "", compression: Any = Compression.none,
                  op: ReduceOp = Average, name: Optional[str] = None,
                  process_set: Optional[ProcessSet] = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce `prescale_factor * tensor` across the members of `process_set`
    (default: all ranks) and return this rank's block of rows (one block per
    member in set order, rows split as evenly as possible, earlier members get
    the remainder), times `postscale_factor`. Horovod 0.28's signature:
    `device_dense` is accepted and ignored (CPU); `compression=Compression.fp16
    /bf16` sends float32 as 16 bits on the wire, each hop's partial sum added
    in fp32 (Horovod casts to fp16 and sums in fp16); `ignore_name_scope`
    changes nothing. Scaling needs a floating-point tensor. Gradient: allgather
    of the upstream gradient, times prescale * postscale (and / members for
    Average)."""
    name = op_name("reducescatter", name, process_set)  # then the checks
    xs = converted([tensor], REDUCESCATTER, [name], process_set)
    checked = Checked(lambda: _check_scatter(xs, device_dense, compression, op, prescale_factor,
                                             postscale_factor, "reducescatter"),
                      REDUCESCATTER, [name], process_set)
    return _scatter(xs, [name], checked, prescale_factor, postscale_factor, process_set,
                    "reducescatter", compression, grouped=False)[0]


def grouped_reducescatter(tensors: Sequence[TensorLike], device_dense: str = "",
                          compression: Any = Compression.none, op: ReduceOp = Average,
                          process_set: Optional[ProcessSet] = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """`reducescatter` of every tensor in the list, in one host crossing
    (Horovod 0.28's signature; arguments as in `reducescatter`). An empty list
    returns an empty list. Differentiable like `reducescatter`."""
    xs = _input_list(tensors, "grouped_reducescatter")
    process_set_id(process_set, "grouped_reducescatter")  # an unregistered set raises even for []
    if not xs:
        _check_scatter(xs, device_dense, compression, op, prescale_factor, postscale_factor,
                       "grouped_reducescatter")  # (before naming: a bad argument raises here)
        return empty_group("reducescatter", op_name("reducescatter", None, process_set),
                           process_set)
    base = op_name("reducescatter", None, process_set)  # then the conversion and the checks
    names = [f"{base}.{i}" for i in range(len(xs))]
    xs = converted(xs, REDUCESCATTER, names, process_set, len(names))
    checked = Checked(lambda: _check_scatter(xs, device_dense, compression, op, prescale_factor,
                                             postscale_factor, "grouped_reducescatter"),
                      REDUCESCATTER, names, process_set, len(names))
    return _scatter(xs, names, checked, prescale_factor, postscale_factor, process_set,
                    "grouped_reducescatter", compression, grouped=True)


def grouped_allgather(tensors: Sequence[TensorLike], name: Optional[str] = None,
                      ignore_name_scope: bool = False,
                      process_set: Optional[ProcessSet] = global_process_set) -> List[tf.Tensor]:
    """`allgather` of every tensor in the list over `process_set`, in one host
    crossing (Horovod 0.28's signature; tensor i is named `<name>.<i>`).
    Gradient, per tensor (as `allgather`): this rank's rows of the upstream
    gradient averaged over the members."""
    xs = _input_list(tensors, "grouped_allgather")
    process_set_id(process_set, "grouped_allgather")  # an unregistered set raises even for []
    base = op_name("allgather", name, process_set)  # then the conversion and the checks
    if not xs:
        return empty_group("allgather", base, process_set)
    names = [f"{base}.{i}" for i in range(len(xs))]
    xs = converted(xs, ALLGATHER, names, process_set, len(names))
    checked = Checked(lambda: _check_inputs(xs, "grouped_allgather"), ALLGATHER, names,
                      process_set, len(names))

    @tf.custom_gradient
    def _fn(*xs):
        def fn(*arrays):
            checked.get()
            with submitting_group(len(arrays), names, ALLGATHER, process_set):
                handles = [_c.allgather_async(a, n, process_set) for a, n in zip(arrays, names)]
            return wait_all(handles)

        ys = _cross(fn, list(xs), [x.dtype for x in xs], [gathered_shape(x) for x in xs],
                    f"grouped_allgather {base!r}")

        def grad(*dys):
            reduced = [allreduce(dy, op=Average, name=f"{n}.grad", process_set=process_set)
                       for dy, n in zip(dys, names)]
            return [own_rows(r, x, f"{n}.grad", process_set) for r, x, n in zip(reduced, xs, names)]

        return ys, grad

    return list(_fn(*xs))
