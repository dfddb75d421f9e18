# gradflow/keras/loss_scale.py — Keras 3's LossScaleOptimizer around a gradflow
# DistributedOptimizer (mixed_float16: model.compile wraps the optimizer by
# itself). Owns the patches of keras.optimizers.LossScaleOptimizer (apply, and
# an lr property); the reduction itself is the wrapped optimizer's (optimizer.py).
"""Note [LossScaleOptimizer]: LossScaleOptimizer.apply checks the gradients
for inf/NaN and calls its inner optimizer's apply() only when they are
finite. Keras assumes the gradients are already reduced there
(tf.distribute reduces them before apply). A gradflow DistributedOptimizer
reduces inside its own apply(), so a rank whose gradients overflowed
skipped the reduction the others were waiting in: they stalled until
GRADFLOW_TIMEOUT and the job died, on the first overflow on some ranks only
(routine under dynamic loss scaling). So, when the inner optimizer is a
gradflow one, apply() first reduces the (scaled) gradients, then runs
Keras's apply on the reduced ones: every rank sees the same inf/NaN,
skips the same steps and halves its scale alike; the inner apply() then
does not reduce again. With backward_passes_per_step=k > 1 the inner
optimizer reduces only every k-th batch, inside Keras's accumulation;
there each batch's "some rank is not finite" flag is reduced instead (one
4-byte Sum) and, when set, every rank's gradients are made NaN, so all skip
that batch alike. A 16-bit wire under a LossScaleOptimizer with k > 1
raises ValueError: the k-th batch's reduction could overflow after the
check and write inf into the weights.

Note [Residuals in unscaled units]: with backward_passes_per_step=1 the
gradients reach the reduction scaled by the loss scale, and with CSC
(sparse_ratio < 1) the core keeps each gradient's unsent part as a residual
that it adds to the next step's gradient. Kept in scaled units, a residual
from before a change of the scale (a halving after an overflow, a doubling
every `dynamic_growth_steps` finite steps) was added at the wrong weight:
2 ranks, LossScaleOptimizer(initial_scale=4, dynamic_growth_steps=2) in
float32 around DistributedOptimizer(sparse_ratio=0.5), 12 steps: weights
0.0251 off the same run without a loss scaler (found by the 2026-11-29
combination audit; with k > 1 the reduction already saw unscaled
gradients). So the gradients are divided by the scale before the reduction
and multiplied by it after (`reduce_unscaled`): the residuals are in
unscaled units, and the loss scaler's finite check and unscaling see what
they saw before. The scale is a power of two, so on a 32-bit wire both
steps are exact and a dense reduction's result is the same, bit for bit.
Not on a 16-bit wire (Compression.fp16/bf16, GRADFLOW_WIRE_DTYPE), where
keeping small gradients representable is the loss scale's point: there the
residuals stay in scaled units. float32/float64 gradients only (a float16
gradient would lose what the scale kept), and not the float8 variables
Keras overwrites with their "gradient" (the loss scaler does not unscale
those either)."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import keras

from .. import _native
from ..compression import wire_code

_patched = False


def install() -> None:
    """Patch LossScaleOptimizer.apply once (idempotent); other optimizers and
    LossScaleOptimizers around non-gradflow optimizers are unchanged."""
    global _patched
    if _patched:
        return
    cls = keras.optimizers.LossScaleOptimizer
    original = cls.apply

    def apply(self: Any, grads: Any, trainable_variables: Optional[List[Any]] = None) -> Any:
        inner = getattr(self, "inner_optimizer", None)
        if not getattr(inner, "_gradflow_wrapped", False):
            return original(self, grads, trainable_variables)
        grads = reduce_unscaled(self, inner, list(grads), trainable_variables,
                                lambda g: inner._gradflow_before_loss_scale(g, trainable_variables))
        inner._gradflow_in_loss_scale = True
        try:
            return original(self, grads, trainable_variables)
        finally:
            inner._gradflow_in_loss_scale = False

    apply.__doc__ = original.__doc__
    cls.apply = apply
    if not hasattr(cls, "lr"):
        cls.lr = property(_lr_get, _lr_set, doc=_lr_get.__doc__)
    _patched = True


def _sixteen_bit_wire(opt: Any) -> bool:
    """Whether `opt` (a gradflow DistributedOptimizer) reduces on a 16-bit wire."""
    wire = wire_code(opt.compression)
    return wire > 0 or (wire < 0 and _native.config()["wire_dtype"] in ("fp16", "bf16"))


def reduce_unscaled(scaler: Any, opt: Any, grads: List[Any], trainable_variables: Any,
                    reduce: Callable[[List[Any]], List[Any]]) -> List[Any]:
    """`reduce(grads)` for gradients scaled by LossScaleOptimizer `scaler`'s
    loss scale, done on the unscaled gradients where that is exact, then
    scaled back (Note [Residuals in unscaled units]). `opt`: the gradflow
    optimizer whose settings say how it reduces."""
    variables = list(trainable_variables if trainable_variables is not None
                     else (scaler._trainable_variables if scaler.built else []))
    if opt.backward_passes_per_step != 1 or _sixteen_bit_wire(opt) or \
            len(variables) != len(grads):
        return reduce(grads)
    # By variable, not by gradient: a gradient None here that another rank
    # has comes back reduced (zeros from this rank, Note [None on some
    # ranks]) and must be scaled back here as there.
    which = [not scaler._overwrite_variable_with_gradient(v) for v in variables]
    if not any(which):
        return reduce(grads)
    if not scaler.built:  # its first apply() (which builds it, as here) is still to come
        with keras.name_scope(scaler.name, caller=scaler):
            scaler.build(variables)
        scaler.built = True
    scale = scaler.dynamic_scale

    def each(gs: List[Any], how: Callable[[Any, Any], Any]) -> List[Any]:
        return [_scaled(g, scale, how) if g is not None and w and _float32_or_64(g) else g
                for g, w in zip(gs, which)]

    return each(list(reduce(each(list(grads), keras.ops.divide))), keras.ops.multiply)


def _float32_or_64(grad: Any) -> bool:
    dtype = getattr(getattr(grad, "values", grad), "dtype", None)
    return keras.backend.standardize_dtype(dtype) in ("float32", "float64")


def _scaled(grad: Any, scale: Any, how: Callable[[Any, Any], Any]) -> Any:
    """`how(grad, scale)` in grad's dtype; a tf.IndexedSlices stays one."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # the backend: already loaded
        if isinstance(grad, tf.IndexedSlices):
            values = how(grad.values, keras.ops.cast(scale, grad.values.dtype))
            return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return how(grad, keras.ops.cast(scale, grad.dtype))


def _lr_get(self: Any) -> Any:
    """The inner gradflow optimizer's `lr` (Keras 2's alias, optimizer.py):
    Horovod's elastic Keras example reads `model.optimizer.lr`, which under
    mixed_float16 is this LossScaleOptimizer. Around any other optimizer
    Keras 3 has no `lr`, and neither has this."""
    if "lr" in self.__dict__:  # set on an optimizer gradflow did not wrap
        return self.__dict__["lr"]
    inner = getattr(self, "inner_optimizer", None)
    if not getattr(inner, "_gradflow_wrapped", False):
        raise AttributeError(f"'{type(self).__name__}' object has no attribute 'lr'")
    return inner.lr


def _lr_set(self: Any, value: Any) -> None:
    inner = getattr(self, "inner_optimizer", None)
    if getattr(inner, "_gradflow_wrapped", False):
        inner.lr = value
    else:  # a plain attribute, as without this property
        self.__dict__["lr"] = value
