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
from ..process_sets import global_process_set
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


def _drop_grads(params: Any) -> None:
    """Gradients are not part of the state: after a rollback they are those
    of the interrupted step (local, or partly reduced), computed with the
    weights just undone. Left in place, a loop that zeroes them after
    step() (or accumulates over backward_passes_per_step passes) added them
    to the first step after the rollback, silently (2026-11-29; Horovod
    leaves them too)."""
    for p in params:
        p.grad = None


class _ModelHandler(_Handler):
    def restore(self) -> None:
        super().restore()
        _drop_grads(self.value.parameters())

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self) -> None:
        super().restore()
        _drop_grads(p for group in self.value.param_groups for p in group["params"])

    def sync(self) -> None:
        # All ranks, as the model (not an optimizer's own process set: the
        # state of the whole job is rank 0's; process sets end at a reset).
        broadcast_optimizer_state(self.value, root_rank=0, process_set=global_process_set)


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


class _ContainerHandler(_Handler):
    """A list, tuple or dict whose every item has a handler (a GAN's
    `models=[g, d]`, `optimizers={"g": opt_g, "d": opt_d}`): each item is
    saved, restored and synced in place by its own handler, in the
    container's order (the same on every rank). As a plain object the
    container was pickled whole by sync(): ranks > 0 got copies, and the
    models the loop trains kept their own weights (silently different
    parameters on a joining worker)."""

    def __init__(self, value: Any):  # pylint: disable=super-init-not-called
        self.set_value(value)

    def set_value(self, value: Any) -> None:
        parts = [_leaf_handler(v) for v in _items(value)]
        if not parts or not all(parts):
            raise ValueError("gradflow: TorchState: a list, tuple or dict holding models, "
                             "optimizers, samplers, GradScalers or LR schedulers must hold "
                             f"nothing else (got {_describe(value)})")
        self.value, self.parts = value, parts

    def save(self) -> None:
        for part in self.parts:
            part.save()

    def restore(self) -> None:
        for part in self.parts:
            part.restore()

    def sync(self) -> None:
        for part in self.parts:
            part.sync()


def _items(value: Any) -> List[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else []


def _handler_class(value: Any) -> Optional[type]:
    """The handler class of a model, optimizer, sampler, scaler or scheduler."""
    return next((h for t, h in _HANDLERS if isinstance(value, t)), None)


def _leaf_handler(value: Any) -> Optional[_Handler]:
    cls = _handler_class(value)
    return None if cls is None else cls(value)


def _holds_handled(value: Any, depth: int = 0) -> bool:
    """Whether a plain value holds (in lists, tuples, dicts or sets) an
    object that needs a handler: pickled with the rest, it would reach
    ranks > 0 as a copy that nothing in their loop uses."""
    if depth and _handler_class(value) is not None:
        return True
    items = list(value) if isinstance(value, (set, frozenset)) else _items(value)
    return depth < 4 and any(_holds_handled(v, depth + 1) for v in items)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} of " + ", ".join(type(v).__name__ for v in _items(value))


def _handler_for(name: str, value: Any) -> Optional[_Handler]:
    """The handler of a TorchState keyword's value, None for a plain object;
    ValueError for a plain object holding one that needs a handler (a list
    mixing a model and a number, a model inside a dict inside a list)."""
    handler = _leaf_handler(value)
    if handler is not None:
        return handler
    if _items(value) and all(_handler_class(v) is not None for v in _items(value)):
        return _ContainerHandler(value)
    if _holds_handled(value):
        raise ValueError(f"gradflow: TorchState: '{name}' holds a model, optimizer, sampler, "
                         "GradScaler or LR scheduler among other objects; it would be "
                         "broadcast as a pickled copy that the training loop does not use. "
                         "Give each as its own keyword, or a list/tuple/dict of only such "
                         "objects")
    return None


def _optimizer_scaler(optimizer: Any) -> Any:
    """The grad_scaler= a DistributedOptimizer was built with, or None."""
    return getattr(getattr(optimizer, "_gradflow", None), "scaler", None)


class TorchState(ObjectState):
    """The state of a PyTorch training process. Models, optimizers,
    ElasticSamplers, torch.amp GradScalers and learning-rate schedulers given
    as keyword arguments (any number; also as a list, tuple or dict of only
    such objects, e.g. a GAN's models=[g, d]) are saved with their
    state_dict and synced by broadcast from rank 0 (in place); anything else
    is a plain object (ObjectState), and a plain object holding one of them
    raises ValueError (its pickled copy would reach ranks > 0 unused). All
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
            handler = _handler_for(k, v)
            if handler is None:
                plain[k] = v
            else:
                handlers[k] = handler
        object.__setattr__(self, "_handlers", handlers)
        object.__setattr__(self, "_auto_scalers", {})  # id(scaler) -> _ScalerHandler
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=lambda obj: broadcast_object(
            obj, root_rank=0, name="gradflow.elastic.state"), get_rank=_runtime.rank, **plain)
        self._all_handlers()  # an optimizer's grad_scaler is saved now, as the rest

    def _named_handlers(self) -> List[_Handler]:
        """The handlers of the keywords, a container's items in its order."""
        return [part for h in self._handlers.values()
                for part in (h.parts if isinstance(h, _ContainerHandler) else [h])]

    def _all_handlers(self) -> List[_Handler]:
        """The named handlers, then one per optimizer's grad_scaler not given
        by name (in the optimizers' order: the same on every rank, which
        the sync's broadcasts rely on). Looked up on each use, so that an
        optimizer replaced by assignment brings its own scaler."""
        named = self._named_handlers()
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
        for handler in self._named_handlers():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
