# gradflow/tensorflow/elastic.py — elastic training for TensorFlow 2
# (Horovod's horovod.tensorflow.elastic): TensorFlowState for a list of
# tf.Variables, TensorFlowKerasState (gradflow.keras.elastic's KerasState) and
# the `run` decorator. The generations, rollback and re-forming live in
# gradflow.elastic; this file only saves, restores and broadcasts variables.
"""Elastic training with TensorFlow 2 (docs/elastic.md):

    state = gradflow.tensorflow.elastic.TensorFlowState(
        model.variables + opt.variables, epoch=0, batch=0)

    @gradflow.tensorflow.elastic.run
    def train(state):
        while state.epoch < epochs:
            ...  # steps with DistributedGradientTape; state.commit() every few
        ...

A lost peer inside a tf.function (the gradient reduction runs in one) reaches
Python as a tf.errors.OpError; `run` turns it into HorovodInternalError when
the generation really lost a peer, so the loop rolls back.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from .. import _runtime
from .._basics import HorovodInternalError, HostsUpdatedInterrupt
from ..elastic import ObjectState, State, run_fn
from ..elastic.run import _peer_lost, reset_runtime
from ..elastic.state import broadcast_object
from ..keras.elastic import KerasState, TensorFlowKerasState
from .functions import broadcast_variables

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState",
           "KerasState", "HorovodInternalError", "HostsUpdatedInterrupt"]


def _as_internal_error(func):
    """A tf.errors.OpError raised while this generation lost a peer becomes
    HorovodInternalError (roll back); every other error is re-raised."""

    def wrapper(state, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if _peer_lost(e):
                raise HorovodInternalError(f"gradflow elastic: a peer was lost inside a "
                                           f"TensorFlow op ({type(e).__name__})") from e
            raise

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = getattr(func, "__doc__", None)
    return wrapper


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run `func(state, ...)` elastically: on a lost peer the state rolls back
    to its last commit, the survivors re-form and call `func` again; when
    hosts are added or removed the group re-forms at the next commit and new
    workers receive rank 0's state (Horovod's horovod.tensorflow.elastic.run)."""
    return run_fn(_as_internal_error(func), reset_runtime)


class TensorFlowState(ObjectState):
    """State of a TensorFlow 2 training process: `variables` (saved in host
    memory on commit, assigned back after a lost peer, broadcast from rank 0
    on sync) plus plain objects given as keyword arguments (epoch=0, ...).

    Args:
        variables: the tf.Variables to keep (model and optimizer variables;
            build the optimizer's slots first, e.g. with `optimizer.build`).
            Horovod's TF1 default (all global variables) does not exist in
            TensorFlow 2 eager mode, so they must be given.
        session: accepted for Horovod compatibility (TF1) and ignored.
    """

    def __init__(self, variables: Optional[Sequence[tf.Variable]] = None, session: Any = None,
                 **kwargs: Any):
        del session
        if variables is None:
            raise ValueError("gradflow: TensorFlowState needs its variables, e.g. "
                             "TensorFlowState(model.variables + optimizer.variables): "
                             "TensorFlow 2 has no global variable collection to default to")
        self.variables: List[tf.Variable] = list(variables)
        for v in self.variables:
            # Keras 3 Variables (model.variables, optimizer.variables) are
            # not tf.Variables but save, assign and broadcast alike.
            if not isinstance(v, (tf.Variable, keras.Variable)):
                raise TypeError("gradflow: TensorFlowState keeps tf.Variables or Keras "
                                f"Variables, got {type(v).__name__}")
        self._saved_variables: List[np.ndarray] = []
        self._save_variables()
        super().__init__(bcast_object=lambda obj: broadcast_object(
            obj, root_rank=0, name="gradflow.elastic.tf_state"), get_rank=_runtime.rank, **kwargs)

    def _save_variables(self) -> None:
        self._saved_variables = [np.array(v.numpy()) for v in self.variables]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for v, saved in zip(self.variables, self._saved_variables):
            v.assign(saved)
        super().restore()

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, root_rank=0, name="gradflow.elastic.tf_variables")
        super().sync()
