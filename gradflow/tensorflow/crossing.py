# gradflow/tensorflow/crossing.py — how the TensorFlow ops' tensors cross to the
# numpy core (`_cross`), eager and inside tf.function, and how unnamed ops are
# named (`op_name`); moved out of ops.py unchanged. No communication logic.
"""The TensorFlow ops' crossing to the numpy API, and their names.

How tensors cross to the core
-----------------------------
Every op hands numpy arrays to `gradflow.collectives` (the numpy API):

* eagerly, the op calls the numpy API directly on `np.asarray(tensor)`, a
  read-only view of the tensor's host buffer (no copy);
* inside `tf.function`, the op is one `tf.numpy_function(..., stateful=True)`
  node whose static output shape is set at trace time. TensorFlow hands the
  Python function numpy views of its inputs (no copy) and adopts the returned
  arrays as output tensors.

The core writes results into fresh numpy arrays, so on CPU a collective costs
at most one host copy per direction (in: none or one to make the array
C-contiguous; out: the result array TF adopts), plus one Python call per op
(per gradient *list* for `grouped_allreduce` / `DistributedGradientTape`).
Stateful numpy_function nodes run in program order inside a tf.function
(automatic control dependencies), so every rank issues its collectives in the
same order. A host callback cannot run under XLA: ops raise when traced with
`jit_compile=True`.

Names: a name given by the caller is used as is. Otherwise, eagerly, names come
from gradflow's per-kind counter (`allreduce.noname.<n>`); while tracing, from a
per-graph counter (`allreduce.tf.<n>`), so every rank tracing the same function
produces the same names whatever the name scopes or graph uids are (hence
Horovod's `ignore_name_scope` is accepted and changes nothing). A process set
counts on its own (`allreduce.tf.set<id>.<n>`).
"""
from __future__ import annotations

import itertools
import weakref
from typing import Callable, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from .. import _dtypes
from .._runtime import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER, GradflowError,
                        auto_name)
from .._withdrawal import announce_empty_group
from ..process_sets import process_set_id

TensorLike = Union[tf.Tensor, tf.Variable, np.ndarray]
SparseRatio = Union[None, float, Callable[[], Optional[float]]]

_KIND_CODES = {"allreduce": ALLREDUCE, "allgather": ALLGATHER, "broadcast": BROADCAST,
               "reducescatter": REDUCESCATTER, "alltoall": ALLTOALL}
# graph -> process set id -> counter
_graph_counters: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()


# ---- helpers: names, XLA guard, the crossing itself ----

def op_name(kind: str, name: Optional[str], process_set=None) -> str:
    """The collective name for one op: `name`, else a counter-based name that
    every rank derives identically (eager: gradflow's counter; tracing: a
    counter per graph), counted per process set."""
    ps = process_set_id(process_set, kind)  # an unregistered set raises here, at trace time
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"gradflow: name must be a non-empty string, got {name!r}")
        return name
    if tf.executing_eagerly():
        return auto_name(_KIND_CODES[kind], None, process_set)
    graph = tf.compat.v1.get_default_graph()
    counter = _graph_counters.setdefault(graph, {}).setdefault(ps, itertools.count())
    return f"{kind}.tf.{next(counter)}" if ps == 0 else f"{kind}.tf.set{ps}.{next(counter)}"


def empty_group(kind: str, base: str, process_set=None) -> list:
    """A grouped op named `base` got an empty list on this rank: returns []
    after telling the other ranks (_withdrawal.announce_empty_group; native
    Note [Grouped lists]), eagerly at once, inside tf.function from a node
    that runs with the graph (the others submit their members per run)."""
    code = _KIND_CODES[kind]
    if tf.executing_eagerly():
        announce_empty_group(code, base, process_set)
    else:
        _check_not_xla(f"grouped {kind}")
        tf.numpy_function(lambda: announce_empty_group(code, base, process_set) or [], [], [],
                          stateful=True, name="gradflow_empty_list")
    return []


def _check_not_xla(what: str) -> None:
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):  # private helper moved: let XLA report it
        return
    if in_xla:
        raise GradflowError(
            f"gradflow: {what} cannot run under XLA (jit_compile=True): gradflow collectives are "
            "host callbacks (tf.numpy_function). Use jit_compile=False (Keras: "
            "model.compile(..., jit_compile=False)).")


def _check_dtype(t: tf.Tensor, what: str) -> None:
    try:
        _dtypes.code_of_name(t.dtype.name)
    except TypeError as e:
        raise TypeError(f"gradflow: {what} of {t.dtype.name} tensor: {e}") from None


def _cross(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence[tf.Tensor],
           touts: Sequence[tf.DType], shapes: Sequence[Optional[Sequence[Optional[int]]]],
           what: str) -> List[tf.Tensor]:
    """Run numpy function `fn` on `inputs`: directly when eager, as one
    stateful tf.numpy_function node (output shapes set) when tracing."""
    full = [tuple(tf.TensorShape(s).as_list()) if s is not None and tf.TensorShape(s).is_fully_defined()
            else None for s in shapes]
    inner = fn

    def fn(*arrays):  # the numpy API returns 0-d inputs as shape [1]: restore static shapes
        return [o if f is None else np.reshape(o, f) for o, f in zip(inner(*arrays), full)]

    if tf.executing_eagerly():
        # .numpy() first: np.asarray of a 0-d bfloat16 eager tensor raises
        # "object __array__ method not producing an array".
        outs = fn(*[np.asarray(t.numpy() if hasattr(t, "numpy") else t) for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, touts)]
    _check_not_xla(what)
    outs = tf.numpy_function(lambda *a: list(fn(*a)), list(inputs), list(touts), stateful=True,
                             name="gradflow_" + what.split(" ")[0])
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    outs = list(outs)
    for o, s in zip(outs, shapes):
        o.set_shape(s)
    return outs


def _as_tensor(tensor: TensorLike) -> tf.Tensor:
    return tf.convert_to_tensor(tensor)


def _resolve_ratio(sparse_ratio: SparseRatio) -> Optional[float]:
    return sparse_ratio() if callable(sparse_ratio) else sparse_ratio
