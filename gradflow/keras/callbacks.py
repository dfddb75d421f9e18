# gradflow/keras/callbacks.py — Keras 3 callbacks for data-parallel training:
# variable broadcast, metric averaging, Horovod's learning-rate warmup and
# schedule, rank-0 best-model checkpoints, sparse-communication warmup
# (TensorBoardStatsCallback lives in stats_callback.py, re-exported here).
# Backend-agnostic: values cross as numpy arrays through gradflow's numpy API.
"""Keras callbacks (Horovod semantics where Horovod has the callback).

Order matters: put `BroadcastGlobalVariablesCallback` first and
`MetricAverageCallback` before any callback that reads epoch metrics
(`BestModelCheckpoint`, `ReduceLROnPlateau`, `EarlyStopping`), so that every
rank sees the same averaged values and takes the same decisions.
`EpochAgreementCallback` (epoch_agreement.py: uneven batch counts, a stop on
some ranks only) goes before `MetricAverageCallback`.
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from typing import Callable, Dict, Optional, Union

import keras
import numpy as np

from .. import collectives as _c
from .._runtime import GradflowError, rank, size
from ..process_sets import global_process_set
from ..settings_check import native_sparse_ratio
from .hyperparameter_check import restart_crc_of
from .optimizer import is_distributed
from .stats_callback import TensorBoardStatsCallback  # noqa: F401  (gradflow.keras.callbacks.*)
from .epoch_agreement import EpochAgreementCallback  # noqa: F401,E402  (the same)


def without_accumulators(optimizer, variables) -> list:
    """`variables` (of `optimizer`) less its gradient accumulators (Keras's
    `_accumulated_gradients`, which `backward_passes_per_step=k > 1` uses;
    a LossScaleOptimizer is looked through): what a broadcast may make equal.

    Note [Accumulators stay local]: with k > 1 each rank's accumulators hold
    the sum of its own batches of the unfinished k-batch step; the step's
    reduction averages them (plus the k-th batch) across ranks. A broadcast
    of every optimizer variable (BroadcastGlobalVariablesCallback at the
    start of a later fit, KerasState.sync() after an elastic reset,
    EpochAgreementCallback's "sync") replaced them by root's partial sum, so
    the step's earlier batches were root's alone on every rank (the others'
    dropped): measured, 2 ranks, k=2, KerasState.sync() after batch 1: the
    update 0.169 off on a 0.337 step (tests/parallel/keras_saved_accumulation_script.py). They are
    left out of those broadcasts, as Horovod's aggregation variables (not
    optimizer variables) are; a rank that has none (a new elastic worker)
    has zeros, so the step then averages the partial sums of the ranks that
    ran those batches. The iteration counter is broadcast, so every rank
    agrees where the step ends. The weights stay identical either way (the
    accumulators only reach them through the reduction)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    local = {id(v) for v in (getattr(inner, "_accumulated_gradients", None) or [])}
    return [v for v in variables if id(v) not in local]


def _variables_of(model: keras.Model):
    """The model's and its optimizer's variables that a broadcast makes equal
    (the gradient accumulators stay each rank's: Note [Accumulators stay local])."""
    opt = model.optimizer
    if opt is not None and not opt.built and model.built:
        # Optimizer slots only exist after the first apply: build them now so
        # they are broadcast too (and every rank creates them identically).
        opt.build(model.trainable_variables)
    if opt is None:
        return list(model.variables)
    return list(model.variables) + without_accumulators(opt, opt.variables)


def broadcast_keras_variables(variables, root_rank: int, name: str) -> None:
    """Assign root's values to Keras variables on every rank: all broadcasts
    submitted, then waited. Variable i is named `<name>.<i>`; a mismatch names
    the tensor and the ranks, and this adds the variable's path."""
    arrays = [np.ascontiguousarray(keras.ops.convert_to_numpy(v)) for v in variables]
    handles = [_c.broadcast_async(a, root_rank, f"{name}.{i}") for i, a in enumerate(arrays)]
    errors = []
    for i, (v, h) in enumerate(zip(variables, handles)):
        try:
            v.assign(np.reshape(h.wait(), tuple(v.shape)))
        except RuntimeError as e:
            errors.append(f"{e} [variable {i}: {getattr(v, 'path', v.name)} shape {tuple(v.shape)}]")
    if errors:
        raise GradflowError("gradflow: broadcast of model variables failed (do all ranks build "
                            "the same model?):\n" + "\n".join(errors))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Horovod's `BroadcastGlobalVariablesCallback(root_rank, device='',
    local_variables=None)`: at the start of training, make every rank's model
    and optimizer variables equal to `root_rank`'s (optimizer variables are
    built first), except `local_variables` (a variable or a list of them,
    matched by identity), which keep each rank's own value, and the gradient
    accumulators of `backward_passes_per_step > 1` (Note [Accumulators stay
    local]). `device` is
    accepted and ignored (GPU placement). Also makes sure a
    DistributedOptimizer is not compiled under XLA.

    A model whose variables do not exist yet when training begins (a
    subclassed model or a Sequential without an Input, on the TensorFlow
    backend: Keras builds it while tracing the first step) is broadcast at
    the end of the first batch instead, as Horovod does: every rank then
    continues from root's weights and optimizer state after that step."""

    def __init__(self, root_rank: int, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = _c.root_rank_of(root_rank)  # 1.5 is no rank: ValueError
        self.device = device  # no-op on CPU (Horovod: device for the broadcast ops)
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = list(local_variables)
        self.broadcast_done = False

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        if self.broadcast_done:
            return
        model = self.model
        if (is_distributed(model.optimizer) and keras.backend.backend() == "tensorflow"
                and getattr(model, "jit_compile", False)):
            model.jit_compile = False  # host callbacks cannot run under XLA
            model.make_train_function(force=True)
        if model.built:
            self._broadcast()
        # else: nothing to broadcast yet (and building the optimizer now
        # would build it over no variables): after the first batch.

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        if not self.broadcast_done:
            self._broadcast()

    def _broadcast(self) -> None:
        local = {id(v) for v in self.local_variables}
        variables = [v for v in _variables_of(self.model) if id(v) not in local]
        broadcast_keras_variables(variables, self.root_rank, "BroadcastGlobalVariablesCallback")
        restart_crc_of(self.model.optimizer)  # the learning rate was broadcast too
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Horovod's `MetricAverageCallback(device='')`: at each epoch end,
    replace every numeric value in `logs`, scalar or array (a per-class
    metric such as `F1Score(average=None)`), by its mean across ranks: one
    allreduce of all values, flattened in sorted-key order. The ranks must
    log the same keys with the same shapes; where they differ (validation
    data on some ranks only) every rank raises ValueError naming each
    rank's keys, before anything is averaged. `device` is accepted and
    ignored (GPU placement).

    Over which ranks (gradflow-only keyword `process_set`): by default the
    members of the process set the model's DistributedOptimizer reduces
    over (a LossScaleOptimizer is looked through), else all ranks. Horovod
    averages over all ranks, so two models trained side by side on two
    process sets each logged (and each set's ReduceLROnPlateau,
    EarlyStopping and checkpoints decided on) the mean of both sets'
    metrics: 4 ranks, sets {0, 2} and {1, 3}, every rank logged loss 4.74
    (found by the 2026-11-29 combination audit)."""

    def __init__(self, device: str = "", *, process_set=None):
        super().__init__()
        self.device = device  # no-op on CPU
        self.process_set = process_set  # None: the optimizer's (_members)

    def _members(self):
        """The process set to average over (see the class docstring)."""
        if self.process_set is not None:
            return self.process_set
        opt = getattr(self.model, "optimizer", None)
        if not is_distributed(opt):
            opt = getattr(opt, "inner_optimizer", None)
        members = getattr(opt, "process_set", None) if is_distributed(opt) else None
        return None if members is global_process_set else members  # None: as before

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        if logs is None:
            return
        keys = sorted(k for k, v in logs.items()
                      if np.issubdtype(np.asarray(v).dtype, np.number))
        shapes = [np.shape(logs[k]) for k in keys]
        members = self._members()
        self._check_same_keys(keys, shapes, members)
        if not keys:
            return
        flat = np.concatenate([np.asarray(logs[k], np.float64).ravel() for k in keys])
        averaged = _c.allreduce(flat, _c.Average, name="MetricAverageCallback",
                                process_set=members)
        at = 0
        for k, shape in zip(keys, shapes):
            n = int(np.prod(shape))
            part = averaged[at:at + n]
            logs[k] = float(part[0]) if shape == () else part.reshape(shape)
            at += n

    @staticmethod
    def _check_same_keys(keys, shapes, members=None) -> None:
        """Same keys and shapes on every member, or ValueError on every one
        (an allreduce of a different layout would average unrelated values,
        or fail with a message that does not name the metrics)."""
        mine = ", ".join(f"{k}{list(s) if s else ''}" for k, s in zip(keys, shapes))
        # Once per epoch: two small collectives are nothing next to an epoch.
        every = _c.allgather_pickled(mine, "MetricAverageCallback.keys.size",
                                     "MetricAverageCallback.keys", members, pickle.dumps,
                                     pickle.loads, "MetricAverageCallback")
        if all(k == mine for k in every):
            return
        ranks = getattr(members, "ranks", None) or range(len(every))
        lines = "; ".join(f"rank {r}: [{k}]" for r, k in zip(ranks, every))
        raise ValueError("gradflow: MetricAverageCallback: the ranks log different metrics, so "
                         f"they cannot be averaged ({lines}); give every rank the same "
                         "metrics and validation data")


def _get_lr(optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _momentum_buffers(optimizer):
    """The buffers momentum correction scales: those of an optimizer with a
    non-zero `momentum` (Keras SGD's `momentums`, RMSprop's `_momentums`),
    which accumulate learning-rate-scaled steps. As Horovod, which corrects
    only optimizers with a `momentum` attribute: Adam's `_momentums` are an
    average of raw gradients, and scaling them would change the training.
    A LossScaleOptimizer (mixed precision) is looked through."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    try:
        momentum = float(keras.ops.convert_to_numpy(getattr(optimizer, "momentum", 0.0) or 0.0))
    except (TypeError, ValueError):
        return []
    if momentum == 0.0:
        return []
    for attr in ("momentums", "_momentums"):
        buffers = getattr(optimizer, attr, None)
        if buffers:
            return list(buffers)
    return []


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's LearningRateScheduleCallback: from `start_epoch` until
    `end_epoch` (exclusive) the learning rate is `initial_lr * multiplier(epoch)`,
    set at the first batch of each epoch (`staircase=True`) or at every batch
    with a fractional epoch `epoch + batch / steps_per_epoch` (`staircase=False`).
    A float multiplier `m` means exponential decay, `m ** (epoch -
    start_epoch)` (Horovod 0.28's rule; fractional epochs unless staircase).

    momentum_correction: when the rate changes from old to new, the momentum
    buffers (SGD's `momentums`) are scaled by new/old before the batch — the
    same update as Horovod's one-batch momentum change (Goyal et al.) for plain
    momentum, done on variables because Keras 3 compiles `momentum` into the step.
    `logs['lr']` gets the rate at each epoch end."""

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("gradflow: LearningRateScheduleCallback needs initial_lr")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return int(steps)
        raise ValueError("gradflow: could not find steps per epoch in the fit parameters; pass "
                         "steps_per_epoch= to the callback")

    def _adjust_learning_rate(self, epoch: float) -> None:
        opt = self.model.optimizer
        old_lr = _get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            ratio = new_lr / old_lr
            for m in _momentum_buffers(opt):
                m.assign(keras.ops.multiply(m, ratio))

    def on_train_begin(self, logs: Optional[Dict] = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict] = None) -> None:
        e = self.current_epoch
        if e < self.start_epoch or (self.end_epoch is not None and e >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(e)
        else:
            self._adjust_learning_rate(e + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warmup (Goyal et al.): over `warmup_epochs` the rate
    rises per batch from `initial_lr / size` to `initial_lr`:
    lr(e) = initial_lr / size * (e' * (size - 1) / warmup_epochs + 1) with
    e' = e + 1 / steps_per_epoch and e the fractional epoch."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0):
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch  # round numbers at each epoch's end
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")


def _fsync_path(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_atomically(path: str, save: Callable[[str], None]) -> None:
    """``save(tmp)`` then rename over `path`. The temporary file lives in a
    fresh private folder (mkdtemp: unpredictable name, mode 0700) beside
    `path`, so nothing planted there (a symbolic link) is followed, and the
    rename stays on one filesystem; the data is fsynced before the rename
    and the folder after it, so a crash leaves the old file or the new one."""
    folder, base = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".tmp-ckpt-", dir=folder)
    try:
        tmp = os.path.join(scratch, base)  # keeps the suffix Keras requires
        save(tmp)
        _fsync_path(tmp)
        os.replace(tmp, path)
        _fsync_path(folder, os.O_DIRECTORY)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's `BestModelCheckpoint(filepath, monitor='val_loss', verbose=0,
    mode='auto', save_freq='epoch')`: a `keras.callbacks.ModelCheckpoint`
    with `save_best_only=True`. Every rank tracks the best value (so all take
    the same decision from the same averaged metrics: put
    MetricAverageCallback before it); only rank 0 writes, and only rank 0
    prints. The file is written to a private temporary folder beside
    `filepath`, fsynced and renamed over it (os.replace), so a reader never
    sees a half-written file and a crash leaves the previous one. `filepath`
    may hold `{epoch}` and log keys and must end in `.keras` or `.h5` (or
    `.weights.h5` with the gradflow-only keyword `save_weights_only=True`).
    `last_saved` holds the path of the latest save decision (on every rank)."""

    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0,
                 mode: str = "auto", save_freq: Union[str, int] = "epoch", *,
                 save_weights_only: bool = False):
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"gradflow: BestModelCheckpoint mode must be auto, min or max, got {mode!r}")
        super().__init__(os.fspath(filepath), monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.last_saved: Optional[str] = None

    def _save_model(self, epoch: int, batch: Optional[int], logs: Optional[Dict]) -> None:
        filepath = self._get_file_path(epoch, batch, logs)
        verbose = self.verbose
        if rank() != 0:
            self.verbose = 0  # the decision (and self.best) on every rank, the messages on rank 0
        try:
            save = self._should_save_model(epoch, batch, logs, filepath)
        finally:
            self.verbose = verbose
        if not save:
            return
        self.last_saved = filepath
        if rank() != 0:
            return
        _save_atomically(filepath, self.model.save_weights if self.save_weights_only
                         else self.model.save)
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")


class SparseWarmupCallback(keras.callbacks.Callback):
    """Dense communication (sparse_ratio 1.0) for the first `warmup_epochs`
    epochs, then `sparse_ratio` (the fraction of gradient chunks sent per
    step). Needs a gradflow DistributedOptimizer; it reads the ratio per step."""

    def __init__(self, warmup_epochs: int, sparse_ratio: float):
        super().__init__()
        if sparse_ratio is None:  # a ratio to switch to is this callback's point
            raise ValueError("gradflow: SparseWarmupCallback: sparse_ratio must be a number, "
                             "got None")
        self.warmup_epochs = int(warmup_epochs)
        # GRADFLOW_SPARSE_RATIO's limits, here rather than at the warm-up's end.
        self.sparse_ratio = native_sparse_ratio(sparse_ratio, "SparseWarmupCallback")

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        opt = self.model.optimizer
        if not is_distributed(opt):
            raise TypeError("gradflow: SparseWarmupCallback needs a model compiled with "
                            "gradflow.keras.DistributedOptimizer")
        opt.sparse_ratio = 1.0 if epoch < self.warmup_epochs else self.sparse_ratio
