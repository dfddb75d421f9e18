"""Elastic training, framework-neutral part (Horovod's horovod.common.elastic):
State, ObjectState and the run loop. Use gradflow.torch.elastic or
gradflow.keras.elastic in training scripts; gradflowrun's --min-np/--max-np/
--host-discovery-script start the job in elastic mode (docs/elastic.md)."""
from typing import Any, Callable

from .._basics import HorovodInternalError, HostsUpdatedInterrupt
from .run import reset_runtime, run_fn
from .state import ObjectState, State, broadcast_object
from .worker import enabled

__all__ = ["State", "ObjectState", "run_fn", "run", "HorovodInternalError",
           "HostsUpdatedInterrupt", "broadcast_object", "enabled"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run `func(state, ...)` elastically (see run_fn)."""
    return run_fn(func, reset_runtime)
