"""Elastic training state (Horovod's horovod.common.elastic.State API):
what a worker keeps in memory, commits, restores after a lost peer and
broadcasts to workers that join. Framework-neutral; gradflow.torch.elastic
and gradflow.keras.elastic add model/optimizer states on top.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .._basics import HostsUpdatedInterrupt
from . import worker as _worker


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """`obj` from root_rank on every rank (pickled; framework-neutral)."""
    from .. import collectives  # noqa: PLC0415 - avoid an import cycle
    name = name or "gradflow.elastic.object"
    # An object root cannot pickle raises on every rank at once (it used to
    # stall the others in the size broadcast until GRADFLOW_TIMEOUT).
    return collectives.broadcast_pickled(obj, root_rank, name + ".size", name + ".data", None,
                                         pickle.dumps, pickle.loads)


def _rank() -> int:
    from .. import _runtime  # noqa: PLC0415
    return _runtime.rank()


class State:
    """State kept in memory across membership changes.

    Args:
        bcast_object: broadcasts a Python object from rank 0 (default:
            gradflow's own, framework-neutral).
        get_rank: returns this worker's current rank.
    """

    def __init__(self, bcast_object: Optional[Callable[[Any], Any]] = None,
                 get_rank: Optional[Callable[[], int]] = None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or _rank
        self._handled_updates = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Callables run after every reset (a worker was added or removed),
        e.g. to scale the learning rate with the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After the group re-formed: reset(), then the registered reset callbacks."""
        self._handled_updates = 0
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in memory (the point a lost peer rolls back to),
        then check_host_updates(). Commits copy the model: commit every few
        batches, trading copy time against work lost on a fault."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank, together, when the
        driver reported hosts added or removed (the ranks agree by one small
        allreduce, so none raises alone). skip_sync is True when hosts were
        only removed: the survivors' states are already equal. It is only a
        wish: a newcomer may join the same generation, and the driver's
        assignment decides for all (run.py, _reset_and_agree)."""
        link = _worker.current()
        if link is None:
            return
        from .. import collectives  # noqa: PLC0415
        seen = np.array([link.updates, int(link.removed), int(link.added)], np.int64)
        agreed = collectives.allreduce(seen, op=collectives.ReduceOp.Max,
                                       name="gradflow.elastic.host_updates")
        if int(agreed[0]) > self._handled_updates:
            self._handled_updates = int(agreed[0])
            only_removed = bool(agreed[1]) and not bool(agreed[2])
            raise HostsUpdatedInterrupt(only_removed)

    def save(self) -> None:
        """Save the state to host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Go back to the last committed state."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a reset, before sync()."""


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and exposed
    as attributes (e.g. ``ObjectState(epoch=0, batch=0)``, ``state.epoch``)."""

    def __init__(self, bcast_object: Optional[Callable[[Any], Any]] = None,
                 get_rank: Optional[Callable[[], int]] = None, **kwargs: Any):
        self._saved_state: Dict[str, Any] = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)
