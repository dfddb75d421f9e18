# gradflow/tensorflow/runtime_ops.py — Horovod's runtime-query ops
# (rank_op, size_op, ...) and horovod.tensorflow.DistributedOptimizer, which
# Horovod routes to the Keras wrapper for Keras optimizers. Translation only.
"""`rank_op`, `local_rank_op`, `size_op`, `local_size_op`,
`process_set_included_op` return the value as
an int32 scalar tensor read when the op runs (inside tf.function too), as
Horovod's ops do; `DistributedOptimizer` wraps a Keras optimizer like
`gradflow.keras.DistributedOptimizer` (TF1 `tf.compat.v1.train.Optimizer`s are
not supported)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from .. import _runtime
from .. import process_sets as _process_sets
from ..collectives import Average, ReduceOp
from ..compression import Compression


def _query_op(fn: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    if tf.executing_eagerly():
        return tf.constant(fn(), tf.int32)
    out = tf.numpy_function(lambda: np.int32(fn()), [], tf.int32, stateful=True,
                            name=name or "gradflow_query")
    out.set_shape([])
    return out


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 scalar tensor."""
    return _query_op(_runtime.rank, name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 scalar tensor."""
    return _query_op(_runtime.local_rank, name)


def _set_ranks(process_set_id: int, what: str) -> list:
    # The ranks of a registered set, read when the op runs (sets can be added
    # and removed after tracing); ValueError for an unknown id.
    if int(process_set_id) == 0:
        return list(range(_runtime.size()))
    try:
        return _process_sets._registered_ranks(int(process_set_id))
    except ValueError as e:
        raise ValueError(f"gradflow: {what}(process_set_id={process_set_id}): {e}") from None


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks in process set `process_set_id` (0: all ranks), as
    an int32 scalar tensor. An id that is not registered raises ValueError
    (Horovod's op fails too)."""
    if tf.executing_eagerly():
        _set_ranks(process_set_id, "size_op")  # raise here, not inside a callback
    return _query_op(lambda: len(_set_ranks(process_set_id, "size_op")), name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this rank is a member of process set `process_set_id` (0: all
    ranks), else 0, as an int32 scalar tensor. Where Horovod returns a
    negative error code (not initialized, unknown set), gradflow raises
    ValueError."""
    def included() -> int:
        return int(_runtime.rank() in _set_ranks(process_set_id, "process_set_included_op"))

    return _query_op(included, name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 scalar tensor."""
    return _query_op(_runtime.local_size, name)


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: ReduceOp = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = _process_sets.global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """horovod.tensorflow.DistributedOptimizer: for a Keras optimizer, the
    same as `gradflow.keras.DistributedOptimizer` (Horovod routes it there
    too); `use_locking` is a TF1 option and ignored. A TF1
    `tf.compat.v1.train.Optimizer` raises TypeError (not supported: use
    DistributedGradientTape in a TF2 loop)."""
    import keras
    del use_locking
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"gradflow.tensorflow.DistributedOptimizer wraps Keras optimizers; got "
                        f"{type(optimizer).__name__} (TF1 tf.compat.v1.train optimizers are not "
                        "supported: use DistributedGradientTape)")
    from ..keras.optimizer import DistributedOptimizer as _keras_distributed
    return _keras_distributed(optimizer, name, device_dense, device_sparse, compression,
                              sparse_as_dense, gradient_predivide_factor, op,
                              backward_passes_per_step, average_aggregated_gradients, num_groups,
                              groups, process_set, scale_local_gradients)
