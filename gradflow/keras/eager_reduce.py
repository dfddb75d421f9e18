# gradflow/keras/eager_reduce.py — the Keras DistributedOptimizer's reductions
# that do not go through gradflow.tensorflow's gradient reduction: the torch
# backend's per-step reduction of numpy arrays (with the presence Sum), the
# "some rank is not finite" flag under a LossScaleOptimizer with
# backward_passes_per_step > 1, and two small backend helpers. Moved out of
# optimizer.py (2026-11-29) unchanged; the wrapper class stays there.
"""Reductions of the Keras `DistributedOptimizer` (optimizer.py) outside the
TensorFlow backend's traced gradient reduction. `opt` is the wrapped
optimizer (its gradflow settings: names, op, compression, process set)."""
from __future__ import annotations

from typing import Any, List, Optional

import keras
import numpy as np

from .. import collectives as _c
from .. import monitor as _monitor
from ..compression import Compression
from ..missing_gradients import fill_zeros, start_presence_sum
from ..one_rank import gradients_are_local


def _eager() -> bool:
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # the backend: already loaded
        return tf.executing_eagerly()
    return True  # torch: Keras steps run eagerly


def _divided(grad: Any, n: int) -> Any:
    if n == 1:
        return grad  # x / 1 == x: no elementwise pass on one rank
    if keras.backend.backend() == "tensorflow":
        from ..tensorflow.gradient_tape import _divide  # handles tf.IndexedSlices too
        return _divide(grad, n)
    return grad / n


def _nan_if_any_rank_not_finite(grads: List[Any], opt: Any) -> List[Any]:
    """Sum over the optimizer's process set of "my gradients are not all
    finite"; if any rank's are not, every rank's gradients become NaN (the
    loss scaler then skips this batch on every rank)."""
    present = [g for g in grads if g is not None]
    if not present:
        return grads
    local = keras.ops.logical_not(keras.ops.all(keras.ops.convert_to_tensor(
        [keras.ops.all(keras.ops.isfinite(g)) for g in present])))
    flag = keras.ops.reshape(keras.ops.cast(local, "float32"), (1,))
    name = f"{opt.gradflow_name}.not_finite"
    if keras.backend.backend() == "tensorflow":
        from ..tensorflow.gradient_tape import reduce_gradients
        total = reduce_gradients([flag], [name], _c.Sum, Compression.none, 1.0, False, 1.0,
                                 opt.process_set)[0]
    else:
        if gradients_are_local(opt.process_set, "DistributedOptimizer", traced=False):
            return grads
        a = keras.ops.convert_to_numpy(flag)
        total = _c.allreduce_async(a, _c.Sum, name, 1.0, 1.0, Compression.none, 1.0,
                                   opt.process_set).wait()
        total = keras.ops.convert_to_tensor(total)
    bad = keras.ops.greater(keras.ops.reshape(total, ()), 0.0)
    return [None if g is None else
            keras.ops.where(bad, keras.ops.full_like(g, float("nan")), g) for g in grads]


def _reduce_eager_numpy(grads: List[Any], names: List[str], opt: Any,
                        presence: Optional[Any] = None) -> List[Any]:
    """Eager backends (torch): gradients cross as numpy arrays, one collective
    each, all submitted before any is waited on so the core fuses them.
    Over a one-member set they come back as they are (gradflow/one_rank.py).

    `presence` (indices, zeros_for), from `_gradflow_presence`: Note [None on
    some ranks] without a round trip of its own. The presence Sum is
    submitted first, this rank's gradients right after it (names need no
    order in the core), and zeros under the names this rank lacks and
    another has once the Sum is back; so the Sum shares the gradients'
    negotiation instead of preceding it (measured: docs/performance.md,
    "Keras run eagerly: the presence Sum")."""
    _monitor.count_step()  # one reduction = one update (gradflowrun --monitor)
    if gradients_are_local(opt.process_set, "DistributedOptimizer", traced=False):
        return list(grads)
    tag = opt._gradflow_hyper.begin_eager()  # this round's hyperparameter tag, or ""
    sum_handle = None
    if presence is not None:
        indices, zeros_for = presence
        sum_handle = start_presence_sum(grads, indices, f"{opt.gradflow_name}.has_gradient",
                                        opt.process_set)
    out = list(grads)
    f = opt.gradient_predivide_factor
    handles = []

    def submit(i: int, g: Any) -> None:
        a = np.ascontiguousarray(keras.ops.convert_to_numpy(g))
        handles.append((i, g, _c.allreduce_async(a, opt.op, names[i], 1.0 / f, f, opt.compression,
                                                 opt.sparse_ratio, opt.process_set,
                                                 step_tag=tag)))

    for i, g in enumerate(grads):
        if g is not None:
            submit(i, g)
    if sum_handle is not None:
        filled = fill_zeros(grads, indices, sum_handle.wait(), zeros_for)
        for i in indices:
            if grads[i] is None and filled[i] is not None:
                submit(i, filled[i])
    for i, g, h in handles:  # (the numpy API gives a 0-d input back as shape [1])
        out[i] = keras.ops.convert_to_tensor(np.reshape(h.wait(), tuple(g.shape)), dtype=g.dtype)
    return out
