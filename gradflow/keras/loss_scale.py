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
check and write inf into the weights."""
from __future__ import annotations

from typing import Any, List, Optional

import keras

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
        grads = inner._gradflow_before_loss_scale(list(grads), trainable_variables)
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
