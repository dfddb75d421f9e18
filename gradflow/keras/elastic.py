# gradflow/keras/elastic.py — elastic training for Keras 3 (Horovod's
# horovod.tensorflow.keras.elastic / horovod.keras.elastic): KerasState, the
# commit / batch / epoch state callbacks and the `run` decorator for model.fit.
# The generations, rollback and re-forming live in gradflow.elastic.
"""Elastic `model.fit` (docs/elastic.md, Keras):

    state = gradflow.keras.elastic.KerasState(model, epoch=0, batch=0)

    @gradflow.keras.elastic.run
    def train(state):
        state.model.fit(x, y, epochs=epochs - state.epoch, callbacks=[
            gradflow.keras.elastic.UpdateEpochStateCallback(state),
            gradflow.keras.elastic.UpdateBatchStateCallback(state),
            gradflow.keras.elastic.CommitStateCallback(state, batches_per_commit=4)])

    train(state)

The model and its DistributedOptimizer stay the user's objects across
resets: nothing is re-created. The optimizer reduces through gradflow's
global runtime on every step (it holds no pool or handle of a generation),
so the compiled train function keeps working after the group re-forms.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import keras
import numpy as np

from .. import _runtime
from ..elastic import ObjectState, run_fn
from ..elastic.run import _peer_lost, reset_runtime
from ..elastic.state import broadcast_object
from .._basics import HorovodInternalError
from .callbacks import broadcast_keras_variables, without_accumulators
from .hyperparameter_check import restart_crc_of

__all__ = ["run", "KerasState", "TensorFlowKerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]


def _as_internal_error(func):
    """With the TensorFlow backend the gradient reduction runs inside
    model.fit's tf.function (tf.numpy_function): a lost peer reaches the
    caller as a tf.errors.OpError wrapping gradflow's HorovodInternalError.
    Turn it back into HorovodInternalError when this generation really lost
    a peer, so the elastic loop rolls back; any other error is re-raised."""

    def wrapper(state, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            raise
        except Exception as e:  # noqa: BLE001 - filtered by _peer_lost below
            if _is_tf_error(e) and _peer_lost(e):
                raise HorovodInternalError(f"gradflow elastic: a peer was lost during "
                                           f"model.fit ({type(e).__name__})") from e
            raise

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = getattr(func, "__doc__", None)
    return wrapper


def _is_tf_error(e: BaseException) -> bool:
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf  # noqa: PLC0415 - only with the TensorFlow backend
    return isinstance(e, tf.errors.OpError)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run `func(state, ...)` elastically (it typically calls model.fit):
    on a lost peer the state rolls back to its last commit, the survivors
    re-form and call `func` again; when hosts are added or removed the group
    re-forms at the next commit and new workers receive rank 0's state. Do
    not call a collective as the decorated call itself."""
    return run_fn(_as_internal_error(func), reset_runtime)


def _optimizer_variables(model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer]) -> List[Any]:
    if optimizer is None:
        return []
    if not optimizer.built and model.built:
        # Slots exist only after the first apply: build them now so that they
        # are saved, restored and broadcast like the weights.
        optimizer.build(model.trainable_variables)
    return list(optimizer.variables) if optimizer.built else []


class KerasState(ObjectState):
    """State of a Keras training process: the model's weights and the
    optimizer's variables (saved in host memory on commit, restored after a
    lost peer, broadcast from rank 0 on sync, except the gradient
    accumulators of backward_passes_per_step > 1, which stay each rank's:
    Note [Accumulators stay local] in callbacks.py), plus plain objects given as
    keyword arguments (e.g. epoch=0, batch=0), exposed as attributes.

    Args:
        model: a built keras.Model (build it, e.g. by compiling and calling it
            or giving an Input, before making the state).
        optimizer: defaults to model.optimizer (a DistributedOptimizer).
        backend: accepted for Horovod compatibility and ignored (Keras 3).
    """

    def __init__(self, model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 backend: Any = None, **kwargs: Any):
        del backend
        if not isinstance(model, keras.Model):
            raise TypeError(f"gradflow: KerasState needs a keras.Model, got {model!r}")
        if not model.built:
            # Its weights do not exist yet: sync() would broadcast nothing
            # and every rank would train from its own initial weights.
            raise ValueError("gradflow: KerasState needs a built model (give the model an "
                             "keras.Input, or call it / model.build(input_shape) first)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self._saved_model: List[np.ndarray] = []
        self._saved_optimizer: List[np.ndarray] = []
        self._save_model()
        super().__init__(bcast_object=lambda obj: broadcast_object(
            obj, root_rank=0, name="gradflow.elastic.keras_state"), get_rank=_runtime.rank,
            **kwargs)

    def _variables(self):
        return list(self.model.variables), _optimizer_variables(self.model, self.optimizer)

    def _save_model(self) -> None:
        model_vars, opt_vars = self._variables()
        self._saved_model = [np.array(keras.ops.convert_to_numpy(v)) for v in model_vars]
        self._saved_optimizer = [np.array(keras.ops.convert_to_numpy(v)) for v in opt_vars]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        model_vars, opt_vars = self._variables()
        for v, saved in zip(model_vars, self._saved_model):
            v.assign(saved)
        # The optimizer may have been built after the last save (no step
        # committed yet): its variables then keep their values, which sync()
        # makes equal on every rank.
        if len(opt_vars) == len(self._saved_optimizer):
            for v, saved in zip(opt_vars, self._saved_optimizer):
                v.assign(saved)
        super().restore()

    def sync(self) -> None:
        model_vars, opt_vars = self._variables()
        # Each rank's gradient accumulators (backward_passes_per_step > 1) stay
        # its own, as restore() left them: Note [Accumulators stay local].
        opt_vars = without_accumulators(self.optimizer, opt_vars)
        broadcast_keras_variables(model_vars + opt_vars, root_rank=0,
                                  name="gradflow.elastic.keras_variables")
        restart_crc_of(self.optimizer)  # the learning rate was broadcast too
        super().sync()


TensorFlowKerasState = KerasState


class CommitStateCallback(keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches and at the end of
    every epoch. Put it after the Update*StateCallbacks so the committed
    counters include the batch just done."""

    def __init__(self, state: KerasState, batches_per_commit: int = 1):
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError(f"gradflow: batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        # Every rank restarts its count after a reset, so all commit together.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep `state.batch` = batches done in the current epoch (counting from
    the value it had when the epoch (re)started), 0 at the end of the epoch.
    Keras 3's fit fixes its steps before callbacks run: to resume mid-epoch,
    give fit only the batches not yet done (see docs/elastic.md, Keras)."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state = state
        self._start = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self._start = int(getattr(self.state, "batch", 0) or 0)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        self.state.batch = self._start + batch + 1

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep `state.epoch` = epochs completed across resets: Keras numbers a
    fit call's epochs from 0 (call fit with epochs=total - state.epoch)."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state = state
        self.initial_epoch = int(state.epoch)

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        self.initial_epoch = int(self.state.epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
