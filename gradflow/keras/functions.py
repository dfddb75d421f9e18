# gradflow/keras/functions.py — Horovod's Keras-level functions for Keras 3:
# allreduce, allgather, broadcast, reducescatter on plain values,
# broadcast_global_variables and load_model. Translation only: the collectives
# are gradflow.tensorflow's (TF backend) or the numpy API's (other backends).
"""Keras-level helpers of `horovod.keras` / `horovod.tensorflow.keras`.

The value functions take anything `np.asarray` accepts (numbers, lists,
arrays, tensors) and return, as Horovod under TensorFlow 2, a `tf.Tensor`
with the TensorFlow backend; with another Keras backend they return a numpy
array. They run immediately (not inside a model's graph).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import keras
import numpy as np

from .. import collectives as _c
from .._withdrawal import preparing
from ..collectives import Average, ReduceOp, op_from_average
from ..compression import Compression
from .optimizer import DistributedOptimizer, is_distributed


def _tf_backend() -> bool:
    return keras.backend.backend() == "tensorflow"


def _host(value: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value) if keras.ops.is_tensor(value) else value)


def _host_once_named(kind: int, name: Optional[str], value: Any):
    """The name drawn, then `value` converted under it (Note [Checks after
    naming]): a value only this rank cannot convert fails the name on every
    rank."""
    name = _c.auto_name(kind, name)
    with preparing(kind, name):
        return name, _host(value)


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[ReduceOp] = None, compression: Any = Compression.none) -> Any:
    """Reduce `value` across ranks (default: average; `average` is Horovod's
    deprecated flag, not together with `op`)."""
    if _tf_backend():
        from .. import tensorflow as gtf
        return gtf.allreduce(value, average, compression=compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             name=name)
    # average= folds into op once named (Note [Checks after naming]): folded
    # before, a rank passing both raised while the others waited for the name
    # until GRADFLOW_TIMEOUT. The conversion too (a ragged list on one rank),
    # here and in the functions below; op itself is checked by _c.allreduce,
    # under the name drawn here.
    name = _c.auto_name(_c.ALLREDUCE, name)
    with preparing(_c.ALLREDUCE, name):
        host = _host(value)
        reduce = (Average if op is None else op) if average is None else op_from_average(average, op)
    return _c.allreduce(host, reduce, name, prescale_factor, postscale_factor, compression)


def allgather(value: Any, name: Optional[str] = None) -> Any:
    """Concatenate every rank's `value` along the first dimension, in rank order."""
    if _tf_backend():
        from .. import tensorflow as gtf
        return gtf.allgather(value, name=name)
    name, host = _host_once_named(_c.ALLGATHER, name, value)
    return _c.allgather(host, name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """Root's `value` on every rank."""
    if _tf_backend():
        from .. import tensorflow as gtf
        return gtf.broadcast(value, root_rank, name=name)
    name, host = _host_once_named(_c.BROADCAST, name, value)
    return _c.broadcast(host, root_rank, name)


def reducescatter(value: Any, name: Optional[str] = None, op: ReduceOp = Average) -> Any:
    """Reduce `value` across ranks; this rank keeps its block of rows."""
    if _tf_backend():
        from .. import tensorflow as gtf
        return gtf.reducescatter(value, op=op, name=name)
    name, host = _host_once_named(_c.REDUCESCATTER, name, value)
    return _c.reducescatter(host, op, name)  # (op checked once named)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TF1 global-variable broadcast. Keras 3 executes eagerly and
    keeps no global variable collection, and Horovod 0.28 itself raises under
    eager execution, so this raises RuntimeError naming the replacements:
    `BroadcastGlobalVariablesCallback(root_rank)` in `fit`, or
    `gradflow.tensorflow.broadcast_variables(model.variables, root_rank)`."""
    raise RuntimeError(
        "gradflow: broadcast_global_variables() needs TF1 graph mode (Keras 3 keeps no global "
        "variables; Horovod raises under eager execution too). Use "
        f"BroadcastGlobalVariablesCallback({root_rank}) in model.fit callbacks, or "
        f"gradflow.tensorflow.broadcast_variables(model.variables, {root_rank}) after the model "
        "and optimizer are built.")


def _all_subclasses(cls: type) -> Iterable[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def _wrapping_class(cls: type, compression) -> type:
    """A class Keras can deserialize under `cls`'s saved name whose
    `from_config` builds `cls` from the saved config and wraps it in a
    DistributedOptimizer (Keras 3 wants a class here, not a factory)."""

    def from_config(_k, config, custom_objects=None):
        return DistributedOptimizer(cls.from_config(config), compression=compression)

    return type(cls.__name__, (cls,), {"from_config": classmethod(from_config),
                                       "_gradflow_loader": True, "__module__": cls.__module__})


def _wrap_loaded(opt: keras.optimizers.Optimizer, model: keras.Model,
                 compression) -> keras.optimizers.Optimizer:
    """A DistributedOptimizer with `opt`'s config and restored state (its
    variables, built over the model's trainable variables as Keras built
    `opt` when loading)."""
    dist = DistributedOptimizer(opt, compression=compression)
    if opt.built:
        dist.build(model.trainable_variables)
        theirs, ours = list(opt.variables), list(dist.variables)
        if [tuple(v.shape) for v in theirs] != [tuple(v.shape) for v in ours]:
            raise ValueError(f"gradflow: load_model: cannot carry the saved {type(opt).__name__} "
                             "state over to its DistributedOptimizer (variables differ)")
        for mine, saved in zip(ours, theirs):
            mine.assign(saved)
    return dist


def load_model(filepath: Any, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = Compression.none,
               legacy_opts: bool = False) -> keras.Model:
    """Load a saved Keras 3 model (`.keras` file) whose optimizer comes back
    wrapped in a gradflow DistributedOptimizer, with its saved state (slots,
    iteration count), whether it was saved wrapped or plain (a
    single-process run's checkpoint). Every Keras optimizer class is recognized by name
    (subclasses such as AdamW included); list your own Optimizer subclasses in
    `custom_optimizers`; `custom_objects` are passed to Keras (and win over
    the wrappers, as Horovod; an optimizer that comes back unwrapped that way
    raises ValueError instead of training without reduction).
    `legacy_opts=True` (Keras 2 legacy optimizers) raises ValueError: Keras 3
    has none."""
    if legacy_opts:
        raise ValueError("gradflow: load_model(legacy_opts=True) is for Keras 2's legacy "
                         "optimizers, which Keras 3 does not have")
    objects: Dict[str, Any] = {}
    wrappers = [c for c in _all_subclasses(keras.optimizers.Optimizer)
                if not getattr(c, "_gradflow_wrapped", False)
                and not getattr(c, "_gradflow_loader", False)
                and c.__module__.startswith("keras.") and c.__name__ != "LossScaleOptimizer"]
    for cls in wrappers + list(custom_optimizers or []):
        wrapped = _wrapping_class(cls, compression)
        objects[cls.__name__] = wrapped
        objects[keras.saving.get_registered_name(cls)] = wrapped
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = model.optimizer
    if (opt is not None and not is_distributed(opt) and type(opt) in wrappers
            and type(opt).__name__ not in (custom_objects or {})):
        # A built-in optimizer saved unwrapped: on the TensorFlow backend its
        # config has no registered name, and Keras then takes the built-in
        # class without looking at custom_objects. Wrap it here, state included.
        model.optimizer = _wrap_loaded(opt, model, compression)
    opt = model.optimizer
    # Mixed precision: Keras saves the LossScaleOptimizer around the wrapped
    # one, and it comes back around a wrapped inner optimizer (it used to be
    # refused here).
    inner = getattr(opt, "inner_optimizer", None)
    if opt is not None and not is_distributed(opt) and not is_distributed(inner):
        # A plain optimizer would train without reducing gradients: never
        # hand that back silently.
        raise ValueError(f"gradflow: load_model: the saved optimizer "
                         f"{type(model.optimizer).__name__} came back unwrapped (a custom_objects "
                         "entry took its name?); pass its class in custom_optimizers instead")
    return model
