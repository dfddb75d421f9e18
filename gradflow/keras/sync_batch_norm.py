# gradflow/keras/sync_batch_norm.py — SyncBatchNormalization for Keras 3
# (Horovod's horovod.tensorflow.SyncBatchNormalization): a
# keras.layers.BatchNormalization whose training moments are those of the
# global batch. Owns the moments math (keras.ops, backend-neutral); the two
# Sum-allreduces it needs are the framework bindings' differentiable ops
# (gradflow.tensorflow.ops / gradflow.torch.ops), chosen by the Keras backend.
"""``SyncBatchNormalization``: Keras batch normalization over the global batch.

Exported as ``gradflow.keras.SyncBatchNormalization`` and
``gradflow.tensorflow.SyncBatchNormalization`` (Horovod's location).

In training (``training=True`` and a trainable layer) on more than one rank,
the mean and variance are those of the concatenation of every rank's local
batch (local batch sizes may differ, a rank's batch may be empty; with a
``mask`` only unmasked positions count, as in Keras). Two small allreduces
per call: the per-channel [count, sum], then the per-channel sum of squared
deviations from the global mean (two passes, so no E[x^2]-E[x]^2
cancellation). The moving statistics then follow Keras's own update with
these global moments, identically on every rank. Inference (or one rank)
is plain Keras batch normalization.

Gradients flow through the allreduces (their gradient is the Sum-allreduce
of the incoming gradient), so the input gradient on rank r is
d(sum of all ranks' losses)/d(x_r) and gamma/beta gradients are this rank's
share; averaging them with ``DistributedOptimizer`` trains on the mean of the
ranks' losses (the same convention as ``gradflow.torch.SyncBatchNorm``).

``process_set=`` (a gradflow extra, as ``gradflow.torch.SyncBatchNorm``'s):
the ranks whose local batches make the global batch, for models trained on
disjoint process sets; only its members may call the layer in training
mode (others raise ValueError at the call, before communicating). It is a
runtime object, so it is not part of ``get_config()``: a layer rebuilt from
a saved model uses all ranks unless constructed again with the set.

Unlike Horovod's (which averages the ranks' moments unweighted, exact only
for equal local batches), the moments are weighted by each rank's count.
Backends: tensorflow (eager and tf.function; not under XLA) and torch.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import keras

from ..collectives import Sum
from ..process_sets import ProcessSet, global_process_set, member_id, process_set_size

__all__ = ["SyncBatchNormalization"]

_BACKENDS = ("tensorflow", "torch")


def _allreduce_sum(t: Any, process_set: Optional[ProcessSet]) -> Any:
    """Differentiable Sum-allreduce of a backend tensor over `process_set`
    (its gradient is the Sum-allreduce of the incoming gradient)."""
    if keras.backend.backend() == "tensorflow":
        from ..tensorflow.ops import allreduce
        return allreduce(t, op=Sum, process_set=process_set)
    from ..torch.ops import allreduce
    return allreduce(t, op=Sum, process_set=process_set)


@keras.saving.register_keras_serializable(package="gradflow")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are synchronized across
    all ranks (Horovod: ``hvd.SyncBatchNormalization(fused=False, **kwargs)``).

    Takes every argument of ``keras.layers.BatchNormalization`` (``axis``,
    ``momentum``, ``epsilon``, ``center``, ``scale``, initializers, ...).
    ``fused`` is Horovod's TF2 argument: only False is accepted (Keras 3 has
    no fused kernel). Every rank must call the layer in training mode in the
    same order (it communicates). ``renorm=True`` is not supported.
    ``process_set`` (keyword only; default all ranks): the ranks whose local
    batches make the global batch (see the module docstring).
    """

    def __init__(self, fused: Optional[bool] = False, *,
                 process_set: Optional[ProcessSet] = global_process_set, **kwargs: Any) -> None:
        if process_set is not None and not isinstance(process_set, ProcessSet):
            raise ValueError("gradflow: SyncBatchNormalization: process_set must be a "
                             f"gradflow.ProcessSet (or None for all ranks), got {process_set!r}")
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if kwargs.get("renorm"):
            raise ValueError("SyncBatchNormalization does not support renorm=True.")
        if keras.backend.backend() not in _BACKENDS:
            raise NotImplementedError(
                f"gradflow: SyncBatchNormalization supports the {' and '.join(_BACKENDS)} Keras "
                f"backends, not {keras.backend.backend()!r}")
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> Tuple[Any, Any]:
        # Training only (Keras computes batch moments in training mode); a
        # non-member raises here, before communicating.
        ps = self.process_set
        member_id(ps, "SyncBatchNormalization")
        if process_set_size(ps, "SyncBatchNormalization") == 1:
            return super()._moments(inputs, mask)
        ops = keras.ops
        axes = self._reduction_axes
        channels = inputs.shape[self.axis]
        bshape = [1] * len(inputs.shape)
        bshape[self.axis] = channels
        if mask is None:
            weights = None
            n = ops.cast(ops.size(inputs), inputs.dtype) / channels
            count = ops.ones((channels,), dtype=inputs.dtype) * n
            local_sum = ops.sum(inputs, axes)
        else:  # as Keras: mask (one dim less than inputs) selects positions
            weights = ops.cast(ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(inputs)),
                               inputs.dtype)
            count = ops.sum(weights, axes)
            local_sum = ops.sum(inputs * weights, axes)
        total = _allreduce_sum(ops.stack([count, local_sum]), ps)
        # Keras's masked moments divide by (count + epsilon); unmasked ones are exact.
        denom = total[0] if mask is None else total[0] + keras.backend.epsilon()
        # (not ops.divide_no_nan: with the torch backend it returns float32 for float64)
        denom = ops.where(denom > 0, denom, ops.ones_like(denom))  # empty global batch: 0, not NaN
        mean = total[1] / denom
        sq = ops.square(inputs - ops.reshape(mean, bshape))
        if weights is not None:
            sq = sq * weights
        variance = _allreduce_sum(ops.sum(sq, axes), ps) / denom
        return mean, variance
