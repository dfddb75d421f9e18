# optimizer_groups.py — Horovod's `groups=` for the torch DistributedOptimizer:
# which parameters form a group (a pure function of the optimizer's parameter
# order, so every rank forms the same groups) and when a group is complete.
# A complete group goes out as one grouped allreduce (submit_group), with the
# optimizer's sparse_ratio.
"""Parameter groups of ``hvd.DistributedOptimizer(groups=...)``."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Set

import torch

from .complex_grads import real_grad
from .grouped_ops import grouped_allreduce_async_


def form_groups(params: Sequence[torch.Tensor], groups: Any) -> Optional[List[List[int]]]:
    """Groups as lists of indices into `params` (the optimizer's trainable
    parameters, in param-group order). An int n splits them into n
    contiguous groups of sizes differing by at most one (Horovod's
    split_list); a list of lists of tensors makes each list a group (tensors
    the optimizer does not train are left out, as in Horovod) and each
    parameter in no list a group of its own. None: no groups."""
    if groups is None:
        return None
    if isinstance(groups, bool) or not (isinstance(groups, list) or
                                        (isinstance(groups, int) and groups > 0)):
        raise ValueError("gradflow: groups should be a positive integer or a list of lists of "
                         f"torch.Tensor, got {groups!r}")
    if isinstance(groups, int):
        n = min(groups, len(params)) or 1
        d, r = divmod(len(params), n)
        return [list(range(i * d + min(i, r), (i + 1) * d + min(i + 1, r))) for i in range(n)]
    index = {id(p): i for i, p in enumerate(params)}
    seen: Set[int] = set()
    out = []
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError("gradflow: groups must consist of torch.Tensor, got "
                                 f"{type(p).__name__}")
            if id(p) in seen:
                raise ValueError("gradflow: a parameter can only appear once in groups")
            seen.add(id(p))
        members = [index[id(p)] for p in group if id(p) in index]
        if members:
            out.append(members)
    return out + [[i] for i in range(len(params)) if id(params[i]) not in seen]


class GroupTracker:
    """Which gradients of each group are ready this step."""

    def __init__(self, groups: List[List[int]]):
        self.groups = groups
        self.group_of: Dict[int, int] = {i: g for g, grp in enumerate(groups) for i in grp}
        self.ready: Dict[int, Set[int]] = {}

    def mark(self, i: int, excluded: Iterable[int] = ()) -> Optional[List[int]]:
        """Gradient i is ready. Returns its group's members (less `excluded`,
        e.g. sparse gradients, which go out on their own) when that completes
        the group, else None."""
        g = self.group_of[i]
        ready = self.ready.setdefault(g, set())
        ready.add(i)
        skip = set(excluded)
        members = [j for j in self.groups[g] if j not in skip]
        if not all(j in ready for j in members):
            return None
        del self.ready[g]
        return members


class Once:
    """One grouped allreduce's handle, shared by the group's parameters:
    waited once, however many parameters ask."""

    def __init__(self, handle: Any):
        self.handle, self.done, self.result = handle, False, None

    def wait(self) -> Any:
        if not self.done:
            self.done = True  # also on error: the error is raised once, then drained
            self.result = self.handle.wait()
        return self.result


def submit_group(s, i: int) -> None:
    """Gradient i of the optimizer state `s` is ready: once its whole group
    is, the group goes out as one grouped allreduce (the core fuses it), as
    Horovod's groups do. Members reduced as sparse gradients go out on their
    own and are left out of the group."""
    members = s.groups.mark(i, excluded=s.sparse)
    if members is not None:
        _submit(s, s.groups.group_of[i], members)


def flush_groups(s) -> None:
    """End of synchronize()'s submissions: a group still waiting whose
    members, less the sparse ones, are all ready goes out now. That happens
    when a member turned out sparse after the others were marked (its hook
    came last, or step 1's agreement made it sparse on a rank where it got
    no gradient: Note [Sparse gradients agreed once] in optimizer_state.py);
    every rank then sends the group without it, under the same names."""
    for g in sorted(s.groups.ready):
        members = [j for j in s.groups.groups[g] if j not in s.sparse]
        if all(j in s.groups.ready[g] for j in members):
            del s.groups.ready[g]
            _submit(s, g, members)


def _submit(s, g: int, members: List[int]) -> None:
    """Group g's `members` as one grouped allreduce named '<prefix>.group<g>',
    with the optimizer's sparse_ratio as the copy path passes it (None: the
    core's GRADFLOW_SPARSE_RATIO; groups never use the pool, so CSC runs
    from step 1 with one residual per tensor name)."""
    ratio = None if s.sparse_ratio < 0 else s.sparse_ratio
    name = f"{s.prefix}.group{g}"
    tensors = [real_grad(s.params[j]) for j in members]
    # From here the grouped op answers for every member: submitted, or all
    # withdrawn if it raises (Note [A failed step] in optimizer_step.py).
    s.answered.add(name)
    h = Once(grouped_allreduce_async_(tensors, name=name, op=s.op,
                                      prescale_factor=s.prescale / s.loss_scale,
                                      postscale_factor=s.postscale * s.loss_scale,
                                      process_set=s.process_set, compression=s.compression,
                                      step_tag=s.step_tag, sparse_ratio=ratio,
                                      rollback_residual=s.rollback_residuals
                                      or name in s.rollback_names))
    for j in members:
        s.handles[id(s.params[j])] = h
