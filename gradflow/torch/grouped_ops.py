# grouped_ops.py — torch grouped collectives: `start_group` and `GroupHandle`
# (one grouped op: members named `<base>.<i>`, submitted all or nothing, each
# carrying the list's length: native Note [Grouped lists]; shared with
# scatter_ops.py's grouped allgather/reducescatter) and Horovod's grouped
# allreduce family (grouped_allreduce, grouped_allreduce_ and their async
# forms) with its autograd gradient. Each member is one of ops.py's
# single-tensor allreduces; the core fuses them.
"""Grouped allreduce for ``import gradflow.torch as hvd``."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch

from .._handles import Handle, wait_all
from .._runtime import ALLREDUCE, auto_name, submitting_group
from .._withdrawal import announce_empty_group, withdraw_all
from .aliasing import check_no_aliasing
from .compression import Compression
from .ops import allreduce_async, allreduce_async_
from ..process_sets import ProcessSet, global_process_set

__all__ = ["grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_"]


class GroupHandle:
    """Handles of a grouped collective; `synchronize` returns the list of results."""

    def __init__(self, handles: List[Any]):
        self.handles = handles

    def poll(self) -> bool:
        return all(h.poll() for h in self.handles)

    def wait(self) -> List[torch.Tensor]:
        return wait_all(self.handles)


def start_group(kind: int, name: Optional[str], process_set: Optional[ProcessSet],
                tensors: Sequence[torch.Tensor],
                start_one: Callable[[torch.Tensor, str], Handle]) -> GroupHandle:
    """A grouped op: `start_one(tensor, member_name)` per tensor under
    `<base>.<i>` names, submitted together (_runtime.submitting_group: all or
    nothing on this rank; each member carries the list's length, so ranks
    whose lists differ in length abort the job at once, native Note
    [Grouped lists]; an empty list sends a marker for the same check)."""
    base = auto_name(kind, name, process_set)
    tensors = list(tensors)
    if not tensors:  # nothing to submit: tell the others (Note [Grouped lists])
        announce_empty_group(kind, base, process_set)
        return GroupHandle([])
    names = [f"{base}.{i}" for i in range(len(tensors))]
    with submitting_group(len(tensors), names, kind, process_set):
        return GroupHandle([start_one(t, n) for t, n in zip(tensors, names)])


@contextlib.contextmanager
def preparing_group(kind: int, base: str, count: int,
                    process_set: Optional[ProcessSet]) -> Iterator[None]:
    """Around what a grouped op of `count` members named `<base>.<i>` does
    between drawing `base` and `start_group` (a user Compressor, argument
    checks): if it raises, every member is withdrawn, so every rank fails
    the group at once (Note [Checks after naming], gradflow/_withdrawal.py)."""
    try:
        yield
    except BaseException as exc:
        withdraw_all(kind, [f"{base}.{i}" for i in range(count)], process_set, exc, count)
        raise


def _grouped(allreduce_one, tensors, average, name, op, prescale_factor, postscale_factor,
             process_set, compression, **tagged) -> GroupHandle:
    """One `allreduce_one` per tensor as one grouped op (the core fuses
    them); each member checks the op once named, so an op bad on one rank
    fails the group on every rank (Note [Checks after naming])."""
    return start_group(ALLREDUCE, name, process_set, tensors,
                       lambda t, member: allreduce_one(t, average, member, op, prescale_factor,
                                                       postscale_factor, process_set,
                                                       compression=compression, **tagged))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Optional[ProcessSet] = global_process_set,
                             compression: Any = Compression.none, *,
                             step_tag: str = "", sparse_ratio: Optional[float] = None,
                             rollback_residual: bool = False) -> GroupHandle:
    """In-place allreduce of a list of tensors over `process_set` (the core
    fuses them); `step_tag`, `sparse_ratio` and `rollback_residual` as
    allreduce_async_'s, for every tensor. The tensors must not overlap in
    memory (ValueError before anything is submitted)."""
    tensors = list(tensors)  # checked, then submitted
    check_no_aliasing(tensors, "grouped_allreduce_")
    return _grouped(allreduce_async_, tensors, average, name, op, prescale_factor,
                    postscale_factor, process_set, compression, step_tag=step_tag,
                    sparse_ratio=sparse_ratio, rollback_residual=rollback_residual)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Optional[ProcessSet] = global_process_set,
                            compression: Any = Compression.none) -> GroupHandle:
    """Allreduce of a list of tensors over `process_set` into new tensors."""
    return _grouped(allreduce_async, tensors, average, name, op, prescale_factor,
                    postscale_factor, process_set, compression)


class _GroupedAllreduceFn(torch.autograd.Function):
    # average and op go to each member, checked there once named (Note
    # [Checks after naming]): an op bad on one rank fails the group everywhere.
    @staticmethod
    def forward(ctx, args, *tensors):
        ctx.args = args
        name, average, op, pre, post, compression, process_set = args
        return tuple(grouped_allreduce_async(tensors, average, name, op, pre, post, process_set,
                                             compression=compression).wait())

    @staticmethod
    def backward(ctx, *grads):
        name, average, op, pre, post, compression, process_set = ctx.args
        gname = None if name is None else name + ".grad"
        return (None,) + tuple(grouped_allreduce_async(grads, average, gname, op, pre, post,
                                                       process_set,
                                                       compression=compression).wait())


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: Any = Compression.none,
                      op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: Optional[ProcessSet] = global_process_set) -> List[torch.Tensor]:
    """Allreduce every tensor of the list over `process_set`; differentiable."""
    args = (name, average, op, prescale_factor, postscale_factor, compression, process_set)
    return list(_GroupedAllreduceFn.apply(args, *tensors))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[int] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Optional[ProcessSet] = global_process_set,
                       compression: Any = Compression.none) -> List[torch.Tensor]:
    """In-place grouped allreduce over `process_set`; returns the tensors."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                    process_set, compression=compression).wait()
