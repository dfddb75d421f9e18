# gradflow/tensorflow/ops.py — TensorFlow collectives on tf.Tensor / tf.Variable,
# eager and inside tf.function, each with a gradient. Crosses to the numpy core
# through crossing.py; must not hold communication logic (that is the core's)
# nor import torch/keras.
"""TensorFlow ops: `allreduce`, `grouped_allreduce`, `allgather`, `broadcast`,
`broadcast_`, `alltoall`, `join`, plus the runtime queries re-exported from
gradflow (reducescatter and the grouped allgather/reducescatter are in
scatter_ops.py).

How tensors cross to the core, and how unnamed ops are named: crossing.py.

Every op takes Horovod's `process_set=` (default: all ranks), translated by
`gradflow._runtime.submit`; sizes and ranks in shapes and gradients are the
set's (`root_rank` stays global, as in Horovod).

Arguments (op, compression, sparse_ratio, root, dtypes, splits) are checked
once the op is named (arguments.py: eagerly a failure withdraws the names
and raises; traced, the node raises at run time), so an argument bad on one
rank fails the op on every rank (Note [Checks after naming],
gradflow/_withdrawal.py).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from .. import collectives as _c
from .. import monitor as _monitor
from .._handles import wait_all
from .._runtime import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, GradflowError, cross_rank,
                        cross_size, init, is_initialized, local_rank, local_size, mpi_comm, rank,
                        shutdown, size, submitting_group)
from ..collectives import Adasum, Average, Max, Min, Product, ReduceOp, Sum, op_from_average
from ..compression import Compression, wire_code
from ..hyperparameter_tag import combine
from ..settings_check import native_sparse_ratio
from ..process_sets import (ProcessSet, global_process_set, process_set_id, process_set_rank,
                            process_set_size)
from .arguments import Checked, converted
from .crossing import (SparseRatio, TensorLike, _as_tensor, _check_dtype, _check_not_xla, _cross,
                       _resolve_ratio, empty_group, op_name)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_comm", "GradflowError", "ReduceOp", "Sum", "Average", "Min",
    "Max", "Product", "Adasum", "Compression", "allreduce", "grouped_allreduce", "allgather",
    "broadcast", "broadcast_", "alltoall", "join",
]

# ---- allreduce ----

def grouped_allreduce_raw(tensors: Sequence[tf.Tensor], names: Sequence[str], op: ReduceOp = Average,
                          compression: Any = Compression.none, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, sparse_ratio: SparseRatio = None,
                          process_set: Optional[ProcessSet] = None,
                          count_step: bool = False, step_tag: str = "",
                          round_tag: Any = None, grouped: bool = False,
                          average: Optional[bool] = None,
                          differentiating: bool = False) -> List[tf.Tensor]:
    """Allreduce several dense tensors over `process_set` in one crossing
    (no gradient): every tensor is submitted before any is waited on, so the
    core can fuse them. `sparse_ratio` may be a callable, read at run time
    on every call. `count_step`: each run is one optimizer update for
    gradflowrun --monitor (counted at run time, not when traced). `step_tag`:
    see `collectives.allreduce_async`. `round_tag` (e.g. the Keras
    hyperparameter check): its `inputs()` go into the crossing after the
    tensors, and `begin(*their values)` at run time gives a tag that every
    allreduce of this run carries too (hyperparameter_tag.combine).
    `grouped`: the tensors are a user's grouped_allreduce list, whose length
    every rank must give alike (native Note [Grouped lists]). `average`:
    Horovod's flag, folded into `op`. `differentiating`: these are an
    allreduce's gradients (only Sum and Average have one). The arguments
    are checked after naming (arguments.Checked)."""
    if not tensors:
        return []
    count = len(tensors)
    tensors = converted(tensors, ALLREDUCE, names[:count], process_set, count if grouped else 0)

    def check() -> ReduceOp:
        for t in tensors:
            _check_dtype(t, "allreduce")
        reduce = op_from_average(average, op)
        if differentiating and reduce not in (Sum, Average):
            raise NotImplementedError(f"gradflow: no gradient for allreduce with op {reduce!r}")
        wire_code(compression)
        if not callable(sparse_ratio):  # (a callable is checked per call, by allreduce_async)
            native_sparse_ratio(sparse_ratio, "allreduce")
        return reduce

    checked = Checked(check, ALLREDUCE, names[:count], process_set, count if grouped else 0)
    round_inputs = list(round_tag.inputs()) if round_tag is not None else []

    def fn(*arrays):
        op = checked.get()  # a check that failed while tracing fails here, on every rank
        if count_step:
            _monitor.count_step()
        tag = combine(step_tag, round_tag.begin(*arrays[count:]) if round_inputs else "")
        ratio = _resolve_ratio(sparse_ratio)
        with submitting_group(count if grouped else 0, names[:count], ALLREDUCE, process_set):
            handles = [_c.allreduce_async(a, op, n, prescale_factor, postscale_factor,
                                          compression, ratio, process_set, step_tag=tag)
                       for a, n in zip(arrays[:count], names)]
        return wait_all(handles)

    return _cross(fn, tensors + round_inputs, [t.dtype for t in tensors],
                  [t.shape for t in tensors], f"allreduce {names[0]!r}")


def _scaled(values: tf.Tensor, factor: float) -> tf.Tensor:
    """`values * factor`; integer values in double, truncated toward zero
    (the core's rule for scaling integer tensors)."""
    if factor == 1.0:
        return values
    if values.dtype.is_floating:
        return values * tf.cast(factor, values.dtype)
    return tf.cast(tf.cast(values, tf.float64) * factor, values.dtype)


def _allreduce_indexed_slices(slices: tf.IndexedSlices, op: Optional[ReduceOp], name: str,
                              process_set: Optional[ProcessSet] = None,
                              prescale_factor: float = 1.0,
                              postscale_factor: float = 1.0, *,
                              average: Optional[bool] = None) -> tf.IndexedSlices:
    # As Horovod: gather every member's values and indices; the optimizer sums
    # duplicate indices. Average divides the values by the number of members.
    # The scale factors apply as for a dense tensor (each member's values
    # times prescale before, the gathered ones times postscale after);
    # Horovod drops them for IndexedSlices, so a value came back unscaled.
    # Checked once named: the values' allgather is the first crossing.
    def check():
        reduce = op_from_average(average, op)
        if reduce not in (Sum, Average):
            raise NotImplementedError("gradflow: allreduce of tf.IndexedSlices supports Sum and "
                                      f"Average, not {reduce!r} (gradients: sparse_as_dense=True "
                                      "makes them dense, as Horovod advises for Adasum)")
        _check_dtype(slices.values, "allgather")
        return reduce, float(prescale_factor), float(postscale_factor)

    checked = Checked(check, ALLGATHER, [f"{name}.values"], process_set)
    reduce, pre, post = checked.value if checked.ok else (Sum, 1.0, 1.0)  # (traced: fails first)
    values = _allgather(_scaled(slices.values, pre), f"{name}.values", process_set, checked)
    indices = allgather(slices.indices, name=f"{name}.indices", process_set=process_set)
    values = _scaled(values, post)
    if reduce == Average:
        values = values / tf.cast(process_set_size(process_set, "allreduce"), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor: Union[TensorLike, tf.IndexedSlices], average: Optional[bool] = None,
              device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
              op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = global_process_set,
              ignore_name_scope: bool = False, *,
              sparse_ratio: Optional[float] = None) -> Union[tf.Tensor, tf.IndexedSlices]:
    """Reduce `tensor` across the ranks of `process_set` (default: all;
    default op: average); same shape and dtype.
    Horovod's signature and positional order: `average` is Horovod's
    deprecated flag (True: Average, False: Sum; not together with `op`);
    `device_dense`/`device_sparse` are accepted and ignored (CPU only);
    `ignore_name_scope` changes nothing (gradflow names never include the name
    scope). tf.IndexedSlices are allgathered (values and indices), as in
    Horovod.
    Gradient: the upstream gradient allreduced with the same op and scaling."""
    name = op_name("allreduce", name, process_set)  # then the checks (Note [Checks after naming])
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, op, name, process_set, prescale_factor,
                                         postscale_factor, average=average)

    @tf.custom_gradient
    def _allreduce(x):
        y = grouped_allreduce_raw([x], [name], op, compression, prescale_factor, postscale_factor,
                                  sparse_ratio, process_set, average=average)[0]

        def grad(dy):
            if isinstance(dy, tf.IndexedSlices):  # gathered, as allreduce() does them
                return allreduce(dy, average, op=op, name=f"{name}.grad",
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, process_set=process_set)
            return grouped_allreduce_raw([dy], [f"{name}.grad"], op, compression,
                                         prescale_factor, postscale_factor, None, process_set,
                                         average=average, differentiating=True)[0]

        return y, grad

    return _allreduce(converted([tensor], ALLREDUCE, [name], process_set)[0])


def grouped_allreduce(tensors: Sequence[TensorLike], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Any = Compression.none, op: Optional[ReduceOp] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Optional[ProcessSet] = global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None, *,
                      sparse_ratio: Optional[float] = None) -> List[tf.Tensor]:
    """Allreduce a list of tensors over `process_set` in one host crossing,
    fused by the core. Horovod's signature (`average`, `device_*`,
    `ignore_name_scope` as in `allreduce`); tensor i is named `<name>.<i>`.
    Every rank must pass a list of the same length: a difference aborts the
    job at once on every rank (native Note [Grouped lists]).
    Gradient: grouped allreduce of the gradients."""
    base = op_name("allreduce", name, process_set)  # then the checks (Note [Checks after naming])
    tensors = converted(tensors, ALLREDUCE, [f"{base}.{i}" for i in range(len(tensors))],
                        process_set, len(tensors))
    if not tensors:
        return empty_group("allreduce", base, process_set)

    @tf.custom_gradient
    def _grouped(*xs):
        ys = grouped_allreduce_raw(list(xs), [f"{base}.{i}" for i in range(len(xs))], op,
                                   compression, prescale_factor, postscale_factor, sparse_ratio,
                                   process_set, grouped=True, average=average)

        def grad(*dys):
            return grouped_allreduce_raw(list(dys), [f"{base}.grad.{i}" for i in range(len(dys))],
                                         op, compression, prescale_factor, postscale_factor,
                                         process_set=process_set, grouped=True, average=average,
                                         differentiating=True)

        return ys, grad

    return list(_grouped(*tensors))


# ---- allgather, broadcast, alltoall ----

def gathered_shape(x: tf.Tensor) -> Optional[List[Optional[int]]]:
    """Static shape of an allgather of `x`: first dimension unknown."""
    if x.shape.rank is None:
        return None
    return [None] + (list(x.shape[1:]) if x.shape.rank else [])


def own_rows(reduced: tf.Tensor, x: tf.Tensor, name: str,
             process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """This rank's rows of `reduced` (an allgather-shaped gradient over
    `process_set`) for input `x`: the gradient of allgather with respect to `x`."""
    rows = tf.reshape(tf.shape(tf.reshape(x, [-1]) if x.shape.rank == 0 else x)[0], [1])
    counts = allgather(rows, name=f"{name}.rows", process_set=process_set)
    start = tf.reduce_sum(counts[:process_set_rank(process_set, "allgather")])
    return tf.reshape(reduced[start:start + rows[0]], tf.shape(x))


def allgather(tensor: TensorLike, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: Optional[ProcessSet] = global_process_set) -> tf.Tensor:
    """Concatenate every member's `tensor` along dimension 0, in rank order (the
    first dimension may differ between ranks; a scalar counts as shape [1]).
    Gradient (as Horovod): this rank's rows of the upstream gradient averaged
    over the members."""
    name = op_name("allgather", name, process_set)
    x = converted([tensor], ALLGATHER, [name], process_set)[0]
    return _allgather(x, name, process_set,
                      Checked(lambda: _check_dtype(x, "allgather"), ALLGATHER, [name], process_set))


def _allgather(x: tf.Tensor, name: str, process_set: Optional[ProcessSet],
               checked: Checked) -> tf.Tensor:
    """allgather of `x` under `name`, its arguments checked by `checked`."""
    def fn(a):
        checked.get()
        return [_c.allgather(a, name, process_set)]

    @tf.custom_gradient
    def _allgather(x):
        y = _cross(fn, [x], [x.dtype], [gathered_shape(x)], f"allgather {name!r}")[0]

        def grad(dy):
            reduced = allreduce(dy, op=Average, name=f"{name}.grad", process_set=process_set)
            return own_rows(reduced, x, f"{name}.grad", process_set)

        return y, grad

    return _allgather(x)


def broadcast(tensor: TensorLike, root_rank: int, name: Optional[str] = None,
              ignore_name_scope: bool = False,
              process_set: Optional[ProcessSet] = global_process_set) -> tf.Tensor:
    """Root's `tensor` on every member (shapes and dtypes must match;
    `root_rank` is a global rank, as in Horovod).
    Gradient (as Horovod): the root gets the upstream gradient averaged over
    the members, other ranks zeros."""
    name = op_name("broadcast", name, process_set)
    x = converted([tensor], BROADCAST, [name], process_set)[0]

    def check() -> int:
        _check_dtype(x, "broadcast")
        return _c.root_rank_of(root_rank)

    checked = Checked(check, BROADCAST, [name], process_set)
    root = checked.value  # (None: failed while tracing; the node raises first)

    @tf.custom_gradient
    def _broadcast(x):
        y = _cross(lambda a: [_c.broadcast(a, checked.get(), name, process_set)], [x], [x.dtype],
                   [x.shape], f"broadcast {name!r}")[0]

        def grad(dy):
            reduced = allreduce(dy, op=Average, name=f"{name}.grad", process_set=process_set)
            return reduced if rank() == root else tf.zeros_like(reduced)

        return y, grad

    return _broadcast(x)


def _as_tf_variable(v: Any) -> Optional[tf.Variable]:
    """`v` itself if a tf.Variable; the tf.Variable a Keras 3 Variable holds
    on the TensorFlow backend (what `model.variables` lists, so Horovod's
    `broadcast_variables(model.variables, 0)` works under Keras 3); else None."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None) if not isinstance(v, (list, tuple)) else None
    return inner if isinstance(inner, tf.Variable) else None


def broadcast_(variables: Union[tf.Variable, Sequence[tf.Variable]], root_rank: int,
               name: Optional[str] = None,
               process_set: Optional[ProcessSet] = global_process_set
               ) -> Union[tf.Tensor, List[tf.Tensor]]:
    """In-place broadcast: assign root's values to `variables` on every member
    of `process_set` (one host crossing for the whole list; variable i is named
    `<name>.<i>`; `root_rank` is global). Returns the variables' new values (a
    list, or one tensor for a single variable), as Horovod. Not differentiable
    (an assignment)."""
    single = _as_tf_variable(variables) is not None
    variables = [variables] if single else list(variables)
    for i, v in enumerate(variables):
        variables[i] = _as_tf_variable(v)
        if variables[i] is None:
            raise TypeError(f"gradflow: broadcast_ assigns in place and needs tf.Variable (or "
                            f"Keras 3 Variable) objects, got {type(v).__name__}; use broadcast() "
                            f"for tensors")
    process_set_id(process_set, "broadcast_")  # an unregistered set raises, even for []
    base = op_name("broadcast", name, process_set)
    if not variables:
        return empty_group("broadcast", base, process_set)
    values = [tf.convert_to_tensor(v) for v in variables]
    names = [f"{base}.{i}" for i in range(len(values))]

    def check() -> int:
        for v in values:
            _check_dtype(v, "broadcast_")
        return _c.root_rank_of(root_rank)

    checked = Checked(check, BROADCAST, names, process_set, len(names))

    def fn(*arrays):
        root = checked.get()
        with submitting_group(len(arrays), names, BROADCAST, process_set):
            handles = [_c.broadcast_async(a, root, n, process_set) for a, n in zip(arrays, names)]
        return wait_all(handles)

    outs = _cross(fn, values, [v.dtype for v in values], [v.shape for v in values],
                  f"broadcast_ {base!r}")
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    with tf.control_dependencies(assigns):
        new = [v.read_value() for v in variables]
    return new[0] if single else new


def alltoall(tensor: TensorLike, splits: Optional[Union[Sequence[int], tf.Tensor]] = None,
             name: Optional[str] = None, ignore_name_scope: bool = False,
             process_set: Optional[ProcessSet] = global_process_set
             ) -> Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]:
    """Send `splits[p]` rows to member p of `process_set` (default: all ranks,
    even split). Returns the rows received from every member in rank order;
    when `splits` is given, also how many rows came from each member (int32),
    as Horovod.
    Gradient: alltoall of the upstream gradient with the received splits."""
    name = op_name("alltoall", name, process_set)
    x = converted([tensor], ALLTOALL, [name], process_set)[0]

    def check() -> tf.Tensor:
        _check_dtype(x, "alltoall")
        sp = tf.zeros([0], tf.int64) if splits is None else _as_tensor(splits)
        if not sp.dtype.is_integer:  # a cast truncated [1.5, 1] to [1, 1]: other rows than asked
            raise TypeError(f"gradflow: alltoall splits must be integers (row counts), got "
                            f"{sp.dtype.name} {splits!r}")
        return tf.cast(sp, tf.int64)

    checked = Checked(check, ALLTOALL, [name], process_set)
    sp = checked.value if checked.ok else tf.zeros([0], tf.int64)  # (traced: the node raises)
    out_shape = [None] + list(x.shape[1:]) if x.shape.rank else [None]

    def fn(a, s):
        checked.get()
        y, received = _c.alltoall(a, None if s.size == 0 else s.tolist(), name, process_set)
        return [y, received.astype(np.int32)]

    @tf.custom_gradient
    def _alltoall(x):
        members = process_set_size(process_set, "alltoall")
        y, received = _cross(fn, [x, sp], [x.dtype, tf.int32], [out_shape, [members]],
                             f"alltoall {name!r}")

        def grad(dy, _unused):
            back, _ = alltoall(dy, received, f"{name}.grad", process_set=process_set)
            return tf.reshape(back, tf.shape(x))

        return (y, received), grad

    y, received = _alltoall(x)
    return y if splits is None else (y, received)


def join() -> tf.Tensor:
    """Declare this rank done (see `gradflow.join`): until every rank has
    joined, it contributes the op's identity (zeros for sum and average) to
    the other ranks' allreduces. Returns the
    rank that joined last, as an int32 scalar tensor (as Horovod)."""
    if tf.executing_eagerly():
        return tf.constant(_c.join(), tf.int32)
    _check_not_xla("join")
    out = tf.numpy_function(lambda: np.int32(_c.join()), [], tf.int32, stateful=True,
                            name="gradflow_join")
    out.set_shape([])
    return out
