# gradflow/keras/optimizer.py — DistributedOptimizer for Keras 3: a dynamic
# subclass of the user's optimizer class that reduces gradients across ranks
# before the parent's update. Translates gradient lists only (TF backend:
# gradflow.tensorflow; torch backend: numpy); no communication logic here.
"""`DistributedOptimizer(optimizer, ...)`: wrap any `keras.optimizers.Optimizer`
so that `model.compile(optimizer=...)` + `model.fit` averages gradients across
ranks.

The wrapper is a subclass of the user's optimizer class built from its config
(`cls.from_config(optimizer.get_config())`, as Horovod does): use the returned
object, not the original. Its `apply()` reduces the gradient list, then calls
the parent's `apply()`. With the TensorFlow backend the reduction is one
`tf.numpy_function` per step (inside `model.fit`'s tf.function), so the model
must not be compiled with XLA: the wrapper raises a clear error when traced
under `jit_compile=True` (Keras resolves `"auto"` to False on CPU-only hosts;
on GPU hosts pass `jit_compile=False` to `model.compile`).

`backward_passes_per_step=k > 1` uses Keras's own gradient accumulation
(`gradient_accumulation_steps=k`): gradients are summed locally for k batches
and averaged over them, and only then reduced across ranks (one communication
every k batches).

`optimizer.sparse_ratio` is read on every step (so `SparseWarmupCallback` can
change it between epochs without retracing): None follows
GRADFLOW_SPARSE_RATIO, 1.0 is dense, r < 1 sends the top r fraction of chunks.
"""
from __future__ import annotations

from typing import Any, List, Optional

import keras
import numpy as np

from .. import collectives as _c
from ..collectives import Average, ReduceOp
from ..compression import Compression


class _DistributedMixin:
    """Methods placed in front of the user's optimizer class (see DistributedOptimizer)."""

    _gradflow_wrapped = True

    def _gradflow_setup(self, name: str, compression, op: ReduceOp, sparse_ratio: Optional[float],
                        backward_passes_per_step: int, sparse_as_dense: bool,
                        gradient_predivide_factor: float) -> None:
        self.gradflow_name = name
        self.compression = compression
        self.op = ReduceOp(op)
        self.sparse_ratio = sparse_ratio
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.gradient_predivide_factor = float(gradient_predivide_factor)

    def apply(self, grads, trainable_variables=None):
        """Reduce `grads` across ranks (every step when backward_passes_per_step
        is 1), then the wrapped optimizer's apply()."""
        grads = list(grads)
        if self.backward_passes_per_step == 1:
            grads = self._gradflow_reduce(grads)
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        # With gradient accumulation Keras calls this once per real update, on
        # the locally averaged accumulated gradients: reduce them here.
        if self.backward_passes_per_step > 1:
            grads = self._gradflow_reduce(list(grads))
        return super()._clip_gradients(grads)

    def _gradflow_reduce(self, grads: List[Any]) -> List[Any]:
        names = [f"{self.gradflow_name}.{i}" for i in range(len(grads))]
        backend = keras.backend.backend()
        if backend == "tensorflow":
            from ..tensorflow.gradient_tape import reduce_gradients
            return reduce_gradients(grads, names, self.op, self.compression,
                                    lambda: self.sparse_ratio, self.sparse_as_dense,
                                    self.gradient_predivide_factor)
        if backend == "torch":
            return _reduce_eager_numpy(grads, names, self)
        raise NotImplementedError(
            f"gradflow.keras.DistributedOptimizer supports the tensorflow and torch Keras "
            f"backends, not {backend!r} (a jitted JAX step cannot call the host core)")


def _reduce_eager_numpy(grads: List[Any], names: List[str], opt: _DistributedMixin) -> List[Any]:
    """Eager backends (torch): gradients cross as numpy arrays, one collective
    each, all submitted before any is waited on so the core fuses them."""
    out = list(grads)
    f = opt.gradient_predivide_factor
    handles = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        a = np.ascontiguousarray(keras.ops.convert_to_numpy(g))
        handles.append((i, g, _c.allreduce_async(a, opt.op, names[i], 1.0 / f, f, opt.compression,
                                                 opt.sparse_ratio)))
    for i, g, h in handles:
        out[i] = keras.ops.convert_to_tensor(h.wait(), dtype=g.dtype)
    return out


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: Optional[str] = None,
                         compression=Compression.none, op: ReduceOp = Average,
                         sparse_ratio: Optional[float] = None, backward_passes_per_step: int = 1,
                         sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class and config) whose updates use
    gradients averaged (op=Average) or summed (op=Sum) across ranks.

    Gradient i of the update is named `<name>.<i>` in the core (name defaults
    to "DistributedOptimizer.<optimizer name>"). `compression` selects the
    wire format, `sparse_ratio` coarse-grained sparse communication (mutable
    per step through `.sparse_ratio`), `sparse_as_dense` makes IndexedSlices
    dense before the allreduce (otherwise they are allgathered)."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"gradflow: DistributedOptimizer needs a keras.optimizers.Optimizer, got {optimizer!r}")
    if getattr(optimizer, "_gradflow_wrapped", False):
        raise ValueError("gradflow: the optimizer is already a DistributedOptimizer")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"gradflow: backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    ReduceOp(op)
    base = optimizer.__class__
    # Same module and name as the user's class: a saved model reloads with the
    # plain optimizer (wrap it again after loading).
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__})
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError("gradflow: use backward_passes_per_step or the optimizer's "
                             "gradient_accumulation_steps, not both")
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
    dist = cls.from_config(config)
    dist._gradflow_setup(name or f"DistributedOptimizer.{optimizer.name}", compression, op,
                         sparse_ratio, backward_passes_per_step, sparse_as_dense,
                         gradient_predivide_factor)
    return dist


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` came from DistributedOptimizer."""
    return bool(getattr(optimizer, "_gradflow_wrapped", False))
