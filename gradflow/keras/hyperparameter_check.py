# gradflow/keras/hyperparameter_check.py — catches ranks whose Keras optimizers
# train with different hyperparameters (learning rate, momentum, ...), at no
# traffic: the Keras side of gradflow/torch/hyperparameter_check.py.
"""Every rank applies the same averaged gradient, so the ranks' weights stay
identical only if every rank's optimizer uses the same hyperparameters.
`keras.callbacks.ReduceLROnPlateau` monitoring a rank-local metric (a
validation loss not averaged by MetricAverageCallback first) lowers the rate
on some ranks only, and the weights drift apart silently (under Horovod too).

Each reduction round (one call of the wrapper's gradient reduction: every
step, or every k-th with backward_passes_per_step=k) calls `begin` before
its first allreduce is submitted. `begin` folds the current values into a
running CRC, so a difference that lasted one step is still seen. Every
`CHECK_EVERY`-th round it returns the step tag
``hyperparameters #<crc> now <values>`` (gradflow/hyperparameter_tag.py)
that every allreduce of the round carries (joined with the traced step's
gradient-list tag by " & ", native Note [Step tags]). Ranks whose tags differ
fail the job at once, every rank raising GradflowError with both ranks'
values. Nothing extra is sent: the tagged round and the next miss the
response cache (two slow-path negotiations every CHECK_EVERY rounds).

Where the values come from: inside a traced step (TensorFlow backend) the
learning rate is a variable or a schedule of `iterations`, known only at run
time, so `inputs()` gives it to the graph as an extra input of the round's
first submit node (tensorflow/overlap.py, tensorflow/ops.py), and `begin`
gets its value. The other hyperparameters (`KEYS`) are Python attributes,
read when `begin` runs. Eagerly (torch backend, `run_eagerly=True`) the
learning rate is read directly (`begin_eager`).

Alignment (the tag must go out in the same round on every rank): every rank
runs every round; the count restarts in a new runtime generation (an elastic
reset: newcomers and old workers alike), after `join()` (ranks that ran out
of data counted fewer rounds), and the CRC restarts where the ranks' values
are made equal (BroadcastGlobalVariablesCallback, KerasState.sync: both
broadcast the learning-rate variable). Over a one-member process set nothing
is reduced and nothing is checked. Gradients that are all tf.IndexedSlices
travel by allgather, which carries no tag: such a model is not checked.
"""
from __future__ import annotations

import weakref
from typing import Any, List, Optional

import keras
import numpy as np

from .. import _runtime, collectives
from .. import hyperparameter_tag as _tag

# Keras 3's optimizer hyperparameters (attributes), in a fixed order.
KEYS = ("momentum", "nesterov", "beta_1", "beta_2", "epsilon", "amsgrad", "weight_decay",
        "rho", "centered", "initial_accumulator_value", "learning_rate_power",
        "l1_regularization_strength", "l2_regularization_strength",
        "l2_shrinkage_regularization_strength", "beta", "beta_2_decay", "epsilon_1",
        "epsilon_2", "clip_threshold", "relative_step", "clipnorm", "clipvalue",
        "global_clipnorm", "use_ema", "ema_momentum", "loss_scale_factor")


def _plain(v: Any) -> Any:
    """hyperparameter_tag.plain; an object of another kind (a tensor, a
    variable) is compared by its type's name only: reading a tensor here
    could run a TensorFlow op inside a numpy callback, and its repr would
    differ between ranks."""
    return _tag.plain(v, lambda other: type(other).__name__)


def _shortest(x: float) -> float:
    """A float32 rate (Keras' default) as its shortest float32 text reads
    (0.05, not 0.05000000074505806): the message stays readable, and equal
    rates stay equal (the map is one to one)."""
    as32 = np.float32(x)
    return float(str(as32)) if float(as32) == x and np.isfinite(as32) else x


_LIVE: "weakref.WeakSet" = weakref.WeakSet()


class HyperparameterCheck:
    """The check of one DistributedOptimizer (its `_gradflow_hyper`)."""

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)  # the optimizer holds this object
        self.crc = 0
        self.rounds = 0
        self.generation = _runtime.generation()
        _LIVE.add(self)

    def restart_count(self) -> None:
        """Every rank restarts here together (join(), a new generation)."""
        self.rounds = 0
        self.crc = 0

    def restart_crc(self) -> None:
        """The ranks' values were just made equal (a broadcast): differences
        before it no longer matter. Collective: every rank does it at the
        same point of its rounds."""
        self.crc = 0

    def _group(self) -> List[Any]:
        """The optimizers whose values are checked: this one, or the ones a
        wrapped keras.optimizers.MultiOptimizer dispatches to (it has no
        learning rate of its own: reading one raised AttributeError at the
        first step)."""
        opt = self._optimizer()
        if isinstance(opt, keras.optimizers.MultiOptimizer):
            return list(opt.optimizers)  # (built from a callable map: none yet)
        return [opt]

    def inputs(self) -> List[Any]:
        """The run-time values a traced round passes to `begin`: the current
        learning rate of each optimizer of the group (variable, schedule or
        callable), as one float64 vector."""
        rates = [keras.ops.reshape(keras.ops.cast(o.learning_rate, "float64"), (1,))
                 for o in self._group()]
        if len(rates) == 1:
            return rates
        return [keras.ops.concatenate(rates) if rates else keras.ops.zeros((1,), "float64")]

    def begin_eager(self) -> str:
        """`begin` with the values read now (eager steps)."""
        return self.begin(keras.ops.convert_to_numpy(self.inputs()[0]))

    def begin(self, learning_rate: Any) -> str:
        """A round starts (`learning_rate`: `inputs()`'s value): fold the
        values in; the round's tag or ""."""
        generation = _runtime.generation()
        if generation != self.generation:  # an elastic reset: every rank starts over
            self.generation = generation
            self.restart_count()
        values = self.values([_shortest(float(x)) for x in np.asarray(learning_rate).reshape(-1)])
        self.crc = _tag.fold(self.crc, values)
        self.rounds += 1
        return _tag.tag(self.crc, values) if _tag.is_check_round(self.rounds) else ""

    def values(self, learning_rates: List[float]) -> List[List[Any]]:
        """One group per optimizer (one, or a MultiOptimizer's): its
        learning rate, then the attributes of KEYS it has and has set (not
        None)."""
        groups = []
        for opt, rate in zip(self._group(), learning_rates):
            items = [("learning_rate", rate)]
            items += [(k, _plain(getattr(opt, k))) for k in KEYS
                      if getattr(opt, k, None) is not None]
            groups.append(items)
        return groups


def restart_crc_of(optimizer: Optional[Any]) -> None:
    """After a broadcast of `optimizer`'s variables (a no-op for an optimizer
    that gradflow did not wrap); through a LossScaleOptimizer to the
    DistributedOptimizer inside it."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    check: Optional[HyperparameterCheck] = getattr(optimizer, "_gradflow_hyper", None)
    if check is not None:
        check.restart_crc()


def _after_join() -> None:
    for check in list(_LIVE):
        check.restart_count()


collectives.after_join.append(_after_join)
