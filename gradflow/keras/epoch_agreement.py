# gradflow/keras/epoch_agreement.py — EpochAgreementCallback: keeps the ranks
# of a Keras `fit` in step at epoch boundaries, where Keras has no join():
# ranks that ran different numbers of batches, or stopped after different
# epochs, fail within seconds with a GradflowError naming the cause (or, on
# request, uneven batches go on as under join()). Translation only: the
# collectives are gradflow's numpy API (join, allgather, broadcast).
"""Note [Keras epoch boundaries].

Without this callback, a rank with fewer batches in an epoch (or one that
stops training, e.g. `EarlyStopping` on a rank-local metric) moves on while
the others still reduce gradients. If it exits, the others fail at once
("shutdown() was called on rank R"); if it calls any collective first
(`MetricAverageCallback`, a broadcast, the next `fit`'s first batch paired
with another rank's last batch of this one), every rank waits
`GRADFLOW_TIMEOUT` (60 s) and then fails inside TensorFlow's `UnknownError`
with the core's stall message, which does not say why (measured 60.7 s,
tests/parallel/keras_epoch_agreement_script.py).

A rank cannot learn what the others still have to do by asking them: a rank
that is still inside a batch waits in its gradient reduction and answers no
other collective. So at each epoch's end every rank first calls `join()`:
a rank that finished its batches contributes zeros to the reductions the
others still run (the core's join, as Horovod's), and `join()` returns once
every rank has finished the epoch. Only then do the ranks compare how many
batches each applied this epoch (the optimizer's own step counter, exact
with `steps_per_execution` and gradient accumulation), one small allgather.

The stop decision is taken by callbacks after this one (EarlyStopping runs
later in the same `on_epoch_end`), so it is compared at the next boundary
every rank reaches: `on_epoch_begin` for a rank that goes on, `on_train_end`
for one that stopped (or finished its epochs). Nothing has been reduced in
between (every rank finished the epoch in `join()`), so the small allgather
there cannot pair with a gradient.

Cost per epoch: one join and two 16-byte allgathers (each a negotiation
through rank 0). Put the callback before every callback that communicates
in `on_epoch_end` (`MetricAverageCallback`), which would otherwise wait for
a rank still in its batches; `BroadcastGlobalVariablesCallback` (train
begin, first batch) may come before it. The same for `on_epoch_begin` and
`on_train_end`, where no gradflow callback communicates.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import keras
import numpy as np

from .. import collectives as _c
from .._runtime import GradflowError, rank
from .hyperparameter_check import restart_crc_of

_MODES = ("raise", "sync")


def _applied_batches(model: keras.Model) -> int:
    """Batches this rank's optimizer has applied (its step counter; Keras
    counts every batch there, also under gradient accumulation). A
    LossScaleOptimizer is looked through."""
    opt = model.optimizer
    opt = getattr(opt, "inner_optimizer", opt)
    counter = getattr(opt, "_iterations", None)
    if counter is None:
        counter = opt.iterations
    return int(keras.ops.convert_to_numpy(counter))


def _allgather_pairs(a: int, b: int, name: str) -> List[List[int]]:
    """[[a, b] of rank 0, [a, b] of rank 1, ...] (one allgather)."""
    got = _c.allgather(np.array([[a, b]], np.int64), name)
    return [[int(v) for v in row] for row in got]


class EpochAgreementCallback(keras.callbacks.Callback):
    """Keeps the ranks of `model.fit` in step at epoch boundaries (Keras has
    no `join()`; Note [Keras epoch boundaries] in this module). Put it
    before every callback that communicates at epoch end
    (`MetricAverageCallback`); `BroadcastGlobalVariablesCallback` may come
    before it.

    At each epoch's end every rank calls `join()` (a rank that ran out of
    batches contributes zeros to the others' remaining reductions instead
    of stalling them), then the ranks compare how many batches each
    applied. If they differ:
      - `uneven_batches="raise"` (default): every rank raises GradflowError
        naming each rank's count (give every rank the same number of
        batches, e.g. `steps_per_epoch=`);
      - `uneven_batches="sync"`: training goes on as under Horovod's
        `join()`: the extra batches were reduced with zeros from the ranks
        that had finished (so they moved the weights by 1/size of their
        gradient where a full average would have), and every rank then
        takes the model and optimizer variables of the rank with the most
        batches (the lowest such rank; gradient accumulators of
        backward_passes_per_step > 1 stay each rank's, Note [Accumulators
        stay local] in callbacks.py), with a warning naming the counts.
    A rank whose `model.stop_training` ends training (EarlyStopping on a
    rank-local metric) while another goes on makes every rank raise
    GradflowError at the next epoch boundary, naming the ranks that
    stopped: average the monitored metric with `MetricAverageCallback`
    (before `EarlyStopping`) so that all stop together.

    Without it such runs fail only after GRADFLOW_TIMEOUT (60 s), inside a
    TensorFlow UnknownError that does not name the cause, or end with the
    ranks' weights silently different."""

    def __init__(self, uneven_batches: str = "raise"):
        super().__init__()
        if uneven_batches not in _MODES:
            raise ValueError(f"gradflow: EpochAgreementCallback(uneven_batches=...) must be one "
                             f"of {_MODES}, got {uneven_batches!r}")
        self.uneven_batches = uneven_batches
        self._start = 0          # the step counter when this epoch began
        self._epoch = -1         # the last epoch that ended here (-1: none in this fit)

    def _check_model(self) -> None:
        if self.model.optimizer is None:
            raise ValueError("gradflow: EpochAgreementCallback needs a compiled model")

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        self._check_model()
        self._epoch = -1

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        if self._epoch >= 0:  # not the first epoch of this fit: agree to go on
            self._agree_on_stopping(going_on=True)
        self._start = _applied_batches(self.model)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self._epoch = epoch
        _c.join()  # every rank has finished its batches of this epoch
        counts = [c for c, _ in _allgather_pairs(_applied_batches(self.model) - self._start, epoch,
                                                 "EpochAgreementCallback.batches")]
        if len(set(counts)) == 1:
            return
        listing = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        if self.uneven_batches == "raise":
            raise GradflowError(
                f"gradflow: the ranks applied different numbers of batches in epoch {epoch + 1} "
                f"({listing}); Keras fit has no join(): give every rank the same number of "
                "batches (e.g. fit(steps_per_epoch=...), or shard the data evenly) and do not "
                "set model.stop_training during an epoch on some ranks only, or pass "
                "EpochAgreementCallback(uneven_batches='sync') to go on as under join()")
        root = counts.index(max(counts))
        from .callbacks import _variables_of, broadcast_keras_variables  # (imports this module)
        broadcast_keras_variables(_variables_of(self.model), root, "EpochAgreementCallback")
        restart_crc_of(self.model.optimizer)  # the learning rate was broadcast too
        if rank() == 0:
            warnings.warn(f"gradflow: the ranks applied different numbers of batches in epoch "
                          f"{epoch + 1} ({listing}): the extra ones were reduced with zeros from "
                          f"the ranks that had finished (join()); every rank goes on from rank "
                          f"{root}'s variables", stacklevel=2)

    def on_train_end(self, logs: Optional[Dict] = None) -> None:
        if self._epoch >= 0:
            self._agree_on_stopping(going_on=False)

    def _agree_on_stopping(self, going_on: bool) -> None:
        """Every rank, between epochs: does it go on to the next epoch?"""
        votes = _allgather_pairs(int(going_on), self._epoch, "EpochAgreementCallback.going_on")
        if len({v for v, _ in votes}) == 1:
            return
        stopped = [r for r, (v, _) in enumerate(votes) if not v]
        on = [r for r, (v, _) in enumerate(votes) if v]
        raise GradflowError(
            f"gradflow: rank(s) {stopped} stopped training after epoch {self._epoch + 1} "
            f"while rank(s) {on} go on to the next (model.stop_training set on some ranks "
            "only, e.g. EarlyStopping on a rank-local metric, or different epochs= per "
            "rank): the ranks must stop together; put "
            "MetricAverageCallback before EarlyStopping so that every rank sees the same value")


__all__: List[Any] = ["EpochAgreementCallback"]
