# gradflow/keras/overwritten.py — the Keras DistributedOptimizer's reduction of
# the "gradients" of variables with `overwrite_with_gradient` (Keras 3's float8
# training: scales and amax histories). Owns which of a step's gradients those
# are and their Max-allreduce; the ordinary gradients are optimizer.py's.
"""Note [Overwritten variables]: Keras 3's float8 layers (`model.quantize(
"float8")`) keep, per layer, scales and amax histories whose variables have
`overwrite_with_gradient=True`: their "gradient" is the variable's new
value (the history rolled by one, with this batch's max |x| in front), and
Keras's optimizer assigns it instead of taking a step (with gradient
accumulation: the elementwise maximum over the k batches). Each rank
computes it from its own batch. Before 2026-11-29 gradflow averaged these
values with the gradients (k = 1: ranks identical, but the amax of the
global batch was its ranks' mean, so the scale let larger values saturate),
and with backward_passes_per_step > 1 Keras took them out before the
accumulated reduction, so each rank kept its own scales and histories (2
ranks: amax histories 1.96 apart, and the ranks' forward passes quantized
differently from then on). Now they are Max-allreduced over the optimizer's
process set on every batch, apart from the gradients (named
`<name>.max.<i>`), before Keras sees them: the amax of the global batch, as
in Transformer Engine's data-parallel amax reduction, identical everywhere.
The new scales derive from the (identical) previous histories, so their Max
is their value."""
from __future__ import annotations

from typing import Any, Dict, List

import keras
import numpy as np

from .. import collectives as _c
from ..one_rank import gradients_are_local


def max_overwritten(opt: Any, grads: List[Any], trainable_variables: Any) -> Dict[int, Any]:
    """The Max-allreduced gradients of `opt`'s overwrite_with_gradient
    variables (a local variable's as it is), by index in `grads`; those entries of `grads` become None
    (the caller's gradient reduction skips them; it puts these back before
    Keras's apply). Empty when there are none (every other model)."""
    if trainable_variables is None:
        if not opt.built:
            return {}
        trainable_variables = opt._trainable_variables
    variables = list(trainable_variables)
    if len(variables) != len(grads):
        return {}  # Keras's apply() raises its own error
    over = [i for i, v in enumerate(variables)
            if grads[i] is not None and getattr(v, "overwrite_with_gradient", False)]
    if not over:
        return {}
    # A local layer's (PartialDistributedOptimizer) stay this rank's, as they
    # are: not Max-reduced, nor divided by the set's size as its gradients.
    held = {i: grads[i] for i in over if id(variables[i]) in opt._gradflow_local_ids}
    over = [i for i in over if i not in held]
    base = opt.gradflow_name
    names = [f"{base}.max.{n[len(base) + 1:]}"  # <name>.<j> -> <name>.max.<j>
             for n in opt._gradflow_names(len(grads), variables)]
    xs, names = [grads[i] for i in over], [names[i] for i in over]
    for i in list(over) + list(held):
        grads[i] = None
    if over:
        held.update(zip(over, _allreduce_max(xs, names, opt.process_set)))
    return held


def _allreduce_max(xs: List[Any], names: List[str], process_set: Any) -> List[Any]:
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # the backend: already loaded

        from ..tensorflow.ops import grouped_allreduce_raw
        if gradients_are_local(process_set, "DistributedOptimizer",
                               traced=not tf.executing_eagerly()):
            return xs
        return grouped_allreduce_raw(xs, names, _c.Max, process_set=process_set)
    if gradients_are_local(process_set, "DistributedOptimizer", traced=False):
        return xs
    handles = [_c.allreduce_async(np.ascontiguousarray(keras.ops.convert_to_numpy(x)), _c.Max, n,
                                  process_set=process_set) for x, n in zip(xs, names)]
    return [keras.ops.convert_to_tensor(np.reshape(h.wait(), tuple(x.shape)), dtype=x.dtype)
            for x, h in zip(xs, handles)]
