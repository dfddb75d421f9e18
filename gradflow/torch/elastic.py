"""Elastic training for PyTorch (Horovod's horovod.torch.elastic): the `run`
decorator, TorchState (model, optimizer, sampler, GradScaler, LR scheduler
and plain objects, committed in memory, restored after a lost peer,
broadcast to joining workers) and ElasticSampler (each sample once per
epoch across membership changes).

    @gradflow.torch.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch): ...
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0: state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)

    state = gradflow.torch.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    train(state)
"""
from __future__ import annotations

import collections
import copy
import math
import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.utils.data

from .. import _runtime
from ..elastic import ObjectState, State, run_fn
from ..elastic.run import reset_runtime
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

# State and ObjectState are re-exported (Horovod users subclass them from here;
# docs/horovod_compat.md lists them), tests/single/test_elastic_names.py keeps this in step.
__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run `func(state, ...)` elastically: on a lost peer the state rolls
    back to its last commit, the survivors re-form and go on; when hosts are
    added or removed the group re-forms at the next commit. Do not call a
    collective as the decorated call itself (new workers sync state first)."""
    return run_fn(func, reset_runtime)


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, but re-partitions the samples not yet
    processed this epoch whenever the membership changes. Keep it in the
    TorchState, call record_batch() after each batch and set_epoch() at the
    *end* of each epoch (so a re-formed group does not repeat samples).

    Args:
        dataset: a sized dataset (constant size).
        shuffle: shuffle the indices each epoch (the same order on every rank).
        seed: shuffling seed, the same on every rank.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas, self.rank = 1, 0
        self.remaining_indices: List[int] = []
        self.num_samples = self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: forget what was processed."""
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that every rank processed one more batch of batch_size."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> Dict[str, int]:
        """The epoch and how many samples of it all ranks have processed."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Restore state_dict()'s values and re-partition the rest of the epoch."""
        self.epoch, self.processed_num = int(state["epoch"]), int(state["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Re-partition what remains of the epoch over the current ranks."""
        self.num_replicas = _runtime.size() if _runtime.is_initialized() else 1
        self.rank = _runtime.rank() if _runtime.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        # Pad to a multiple of the ranks so that every rank yields exactly
        # num_samples: a rank with fewer batches would wait in a collective
        # the others never start. Fewer samples left than ranks (a group that
        # grew near the end of an epoch) needs the list repeated more than
        # once (torch's DistributedSampler does the same).
        pad = self.total_size - len(indices)
        if pad > 0:
            indices += (indices * math.ceil(pad / len(indices)))[:pad]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """Saves, restores and syncs one kind of object in a TorchState. Every
    kind saves a deep copy of its state_dict and restores it; they differ
    only in how rank 0's state reaches the others (sync)."""

    def __init__(self, value: Any):
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0,
                                                    name="gradflow.elastic.sampler"))


class _ScalerHandler(_Handler):
    """A torch.amp GradScaler, changed in place: the training loop and
    DistributedOptimizer(grad_scaler=) hold this very object, so a sync must
    not replace it (as a plain object, ObjectState's sync rebound the
    attribute to an unpickled copy on ranks other than 0, and the optimizer
    went on reading the original's scale)."""

    def restore(self) -> None:
        super().restore()
        # A step interrupted between scaler.step() and update() leaves its
        # per-optimizer record ("unscale_() has already been called") behind;
        # the rolled-back step starts afresh, as after update().
        fresh = getattr(torch.amp.grad_scaler, "_refresh_per_optimizer_state", None)
        if fresh is not None and hasattr(self.value, "_per_optimizer_states"):
            self.value._per_optimizer_states = collections.defaultdict(fresh)

    def sync(self) -> None:
        # load_state_dict fills the scale and growth tracker tensors in place.
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0,
                                                    name="gradflow.elastic.grad_scaler"))


class _SchedulerHandler(_Handler):
    """A learning-rate scheduler (LRScheduler, ReduceLROnPlateau), saved,
    restored and synced through its state_dict, in place. As a plain object
    (ObjectState) it was saved by reference, so a rollback left its epoch
    count ahead of the restored optimizer, and sync() pickled it whole: with
    it the optimizer, which for a DistributedOptimizer (a class made at run
    time) raised PicklingError on rank 0 at the first sync, and for another
    optimizer left ranks > 0 a scheduler driving an unpickled copy of rank
    0's optimizer instead of their own."""

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0,
                                                    name="gradflow.elastic.lr_scheduler"))


_SCHEDULERS = tuple(t for t in (getattr(torch.optim.lr_scheduler, "LRScheduler", None),
                                getattr(torch.optim.lr_scheduler, "_LRScheduler", None),
                                torch.optim.lr_scheduler.ReduceLROnPlateau) if t is not None)

_HANDLERS: List[Tuple[Any, type]] = [(torch.nn.Module, _ModelHandler),
                                     (torch.optim.Optimizer, _OptimizerHandler),
                                     (ElasticSampler, _SamplerHandler),
                                     (torch.amp.GradScaler, _ScalerHandler),
                                     (_SCHEDULERS, _SchedulerHandler)]


def _optimizer_scaler(optimizer: Any) -> Any:
    """The grad_scaler= a DistributedOptimizer was built with, or None."""
    return getattr(getattr(optimizer, "_gradflow", None), "scaler", None)


class TorchState(ObjectState):
    """The state of a PyTorch training process. Models, optimizers,
    ElasticSamplers, torch.amp GradScalers and learning-rate schedulers given
    as keyword arguments (any number) are saved with their state_dict and
    synced by broadcast from rank 0 (in place); anything else is a plain
    object (ObjectState). All
    become attributes. The GradScaler a DistributedOptimizer was built with
    (grad_scaler=) is part of the state without being given: a scaler left
    out kept a joining worker's own loss scale, so ranks scaled their
    gradients differently and silently ended with different parameters."""

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any):
        kwargs.update(model=model, optimizer=optimizer)
        handlers: Dict[str, _Handler] = {}
        plain: Dict[str, Any] = {}
        for k, v in kwargs.items():
            cls = next((h for t, h in _HANDLERS if isinstance(v, t)), None)
            if cls is None:
                plain[k] = v
            else:
                handlers[k] = cls(v)
        object.__setattr__(self, "_handlers", handlers)
        object.__setattr__(self, "_auto_scalers", {})  # id(scaler) -> _ScalerHandler
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=lambda obj: broadcast_object(
            obj, root_rank=0, name="gradflow.elastic.state"), get_rank=_runtime.rank, **plain)
        self._all_handlers()  # an optimizer's grad_scaler is saved now, as the rest

    def _all_handlers(self) -> List[_Handler]:
        """The named handlers, then one per optimizer's grad_scaler not given
        by name (in the optimizers' order: the same on every rank, which
        the sync's broadcasts rely on). Looked up on each use, so that an
        optimizer replaced by assignment brings its own scaler."""
        named = list(self._handlers.values())
        held = {id(h.value) for h in named if isinstance(h, _ScalerHandler)}
        auto: Dict[int, _Handler] = {}
        for h in named:
            scaler = _optimizer_scaler(h.value) if isinstance(h, _OptimizerHandler) else None
            if scaler is not None and id(scaler) not in held and id(scaler) not in auto:
                old = self._auto_scalers.get(id(scaler))
                auto[id(scaler)] = old if old is not None and old.value is scaler \
                    else _ScalerHandler(scaler)
        object.__setattr__(self, "_auto_scalers", auto)
        return named + list(auto.values())

    def save(self) -> None:
        for handler in self._all_handlers():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._all_handlers():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._all_handlers():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
