# functions.py — whole-model helpers built on the tensor collectives:
# broadcast_parameters, broadcast_optimizer_state, broadcast_object,
# allgather_object. Objects travel pickled as numpy uint8 arrays; tensors
# travel through ops.broadcast_async_. No communication logic of its own.
"""Model/optimizer state helpers for ``import gradflow.torch as hvd``."""
from __future__ import annotations

import pickle
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .. import collectives as _np_coll
from .._runtime import ALLGATHER, BROADCAST, GradflowError, auto_name, rank
from ..process_sets import ProcessSet, global_process_set, set_ranks
from .complex_grads import broadcast_view
from .hyperparameter_check import restart_crc
from .ops import broadcast_async_

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object", "check_same_everywhere"]


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = global_process_set) -> Any:
    """Root's `obj` (any picklable object) on every member of `process_set`
    (`root_rank` is a global rank); other ranks' `obj` is ignored. Ranks must
    call it in the same order. If root's `obj` cannot be pickled, root raises
    the pickling error and every other member a GradflowError quoting it, at
    once (collectives.broadcast_pickled)."""
    base = name or auto_name(BROADCAST, None, process_set)
    return _np_coll.broadcast_pickled(obj, root_rank, base + ".size", base + ".data", process_set,
                                      _dumps, pickle.loads, "broadcast_object")


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = global_process_set) -> List[Any]:
    """Every member's `obj`, in rank order (pickled, one uint8 allgather);
    `process_set` is a gradflow extra (Horovod's has none). If some member's
    `obj` cannot be pickled, every member raises at once (that member its
    pickling error, the others a GradflowError naming it)."""
    base = name or auto_name(ALLGATHER, None, process_set)
    return _np_coll.allgather_pickled(obj, base + ".size", base + ".data", process_set, _dumps,
                                      pickle.loads, "allgather_object")


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _describe(entries: List[Tuple[str, Tuple[int, ...], str]]) -> Dict[str, Tuple]:
    return {n: (s, d) for n, s, d in entries}


def check_same_everywhere(entries: List[Tuple[str, Tuple[int, ...], str]], what: str,
                          process_set: Optional[ProcessSet] = global_process_set) -> None:
    """Collective check (over `process_set`) that every member passes the
    same (name, shape, dtype) list; raises GradflowError on every member
    naming the first difference."""
    everyone = allgather_object(entries, name=None, process_set=process_set)
    ref = everyone[0]
    if all(e == ref for e in everyone):
        return
    ref_map = _describe(ref)
    for r, e in enumerate(everyone):
        if e == ref:
            continue
        mine = _describe(e)
        for n in list(ref_map) + list(mine):
            if ref_map.get(n) != mine.get(n):
                a = ref_map.get(n, "absent")
                b = mine.get(n, "absent")
                raise GradflowError(
                    f"gradflow: {what}: tensor '{n}' is {_fmt(a)} on rank 0 but {_fmt(b)} on rank "
                    f"{r}; every rank must build the same model")
        raise GradflowError(f"gradflow: {what}: rank 0 and rank {r} list the same tensors in a "
                            "different order; every rank must build the same model")


def _fmt(sig) -> str:
    if sig == "absent":
        return "absent"
    shape, dtype = sig
    return f"shape {tuple(shape)} {dtype}"


def broadcast_parameters(params: Union[Dict[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]],
                         root_rank: int, *,
                         process_set: Optional[ProcessSet] = global_process_set) -> None:
    """Overwrite `params` in place with root's values. `params` is a
    `state_dict()` (items taken in sorted order), `named_parameters()`, or
    `parameters()` (as in Horovod, a list may mix (name, tensor) pairs and
    bare tensors; a bare tensor is named by its position, `#<i>`).
    Checks first that every rank has the same names, shapes and dtypes.
    `process_set` (a gradflow extra, keyword only): only its members take
    part and `root_rank` (a global rank) must be one of them: the model a
    DistributedOptimizer(process_set=) trains (Note [State of a process
    set's model])."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not torch.is_tensor(params):
        # Horovod: "support both named_parameters() and regular parameters()".
        # A bare tensor used to be unpacked as a (name, value) pair: a
        # 2-row weight became the name and value of its own rows.
        items = [p if isinstance(p, tuple) else (f"#{i}", p) for i, p in enumerate(params)]
    else:
        raise ValueError(f"gradflow: broadcast_parameters: invalid params of type {type(params)}")
    items = [(n, p) for n, p in items if p is not None]
    for n, p in items:
        if not torch.is_tensor(p):
            raise ValueError(f"gradflow: broadcast_parameters: '{n}' is a {type(p).__name__}, "
                             "not a tensor")
    check_same_everywhere([(n, tuple(p.shape), str(p.dtype)) for n, p in items],
                          "broadcast_parameters", process_set)
    root = rank() == root_rank  # complex tensors travel as float pairs (broadcast_view)
    handles = [broadcast_async_(broadcast_view(p.detach(), root), root_rank,
                                name=f"broadcast_parameters.{n}", process_set=process_set)
               for n, p in items]
    for h in handles:
        h.wait()


class _TensorRef:
    """Placeholder for a tensor inside a pickled optimizer state skeleton."""

    def __init__(self, index: int, shape: Tuple[int, ...], dtype: torch.dtype):
        self.index, self.shape, self.dtype = index, shape, dtype


def _strip(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if torch.is_tensor(obj):
        tensors.append(obj)
        return _TensorRef(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _fill(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


# Note [State of a process set's model]
# --------------------------------------
# A DistributedOptimizer(process_set=ps) trains a model of ps's members
# only; the other ranks train other models (or none). Both helpers used to
# run on all ranks, so the members alone stalled in the first collective
# until GRADFLOW_TIMEOUT (the others never call it), and each set passing
# its own root failed on the mismatched roots: no call synced the set's
# optimizer state. broadcast_optimizer_state now runs on the optimizer's
# own set (a plain torch optimizer, and process_set= given, as told), and
# broadcast_parameters takes process_set= (parameters do not know their
# set). A root outside the set is refused by the core, on the members.


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None, *,
                              process_set: Optional[ProcessSet] = None) -> None:
    """Make every rank's optimizer state (hyperparameters of each param
    group, per-parameter state such as momentum buffers and step counts)
    equal to root's. The structure travels pickled; every tensor travels
    by an in-place broadcast; non-root ranks then `load_state_dict` it, so
    ranks whose state was still empty get root's.

    As Horovod, when root's state is still empty every rank whose state is
    empty first initialises it with one local step on zero gradients (see
    _init_empty_state); `model` (Horovod's keyword) marks sparse embeddings,
    whose zero gradients are then sparse for SGD.

    Where Horovod lets the ranks' parameters differ, gradflow does not: that
    step moves the parameters (weight decay), so a rank takes it only when
    root takes it too (root's state empty), and when some rank had state and
    did not take it, the parameters are then broadcast from root. Horovod's
    recipe "load the checkpoint on rank 0, then broadcast", and a worker
    joining an elastic job, left every rank but root with its weights
    decayed once (AdamW: ~lr * weight_decay of each weight).

    `process_set` (a gradflow extra, keyword only): the members that take
    part (`root_rank`, a global rank, among them); by default a
    DistributedOptimizer's own process set, all ranks for other optimizers
    (Note [State of a process set's model])."""
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"gradflow: broadcast_optimizer_state: model must be a torch.nn.Module, "
                        f"got {type(model).__name__}")
    # L-BFGS's step needs a closure: no initialising step (Horovod refuses
    # L-BFGS altogether; gradflow copies its state like any other).
    if process_set is None:
        own = getattr(optimizer, "__dict__", {}).get("_gradflow")
        process_set = getattr(own, "process_set", None) or global_process_set
    empty = (len(optimizer.state_dict()["state"]) == 0
             and not isinstance(optimizer, torch.optim.LBFGS))
    empties = dict(zip(set_ranks(process_set, "broadcast_optimizer_state"),
                       allgather_object(empty, name="broadcast_optimizer_state.empty",
                                        process_set=process_set)))
    if root_rank not in empties:
        raise ValueError(f"gradflow: broadcast_optimizer_state: root_rank {root_rank} is not a "
                         f"member of {process_set} (root_rank is a global rank)")
    if empties[root_rank] and empty:
        _init_empty_state(optimizer, model)
    root = rank() == root_rank
    tensors: List[torch.Tensor] = []
    skeleton = _strip(optimizer.state_dict(), tensors) if root else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state.skeleton",
                                process_set=process_set)
    if not root:
        refs: List[_TensorRef] = []
        _collect_refs(skeleton, refs)
        tensors = [torch.empty(r.shape, dtype=r.dtype) for r in sorted(refs, key=lambda r: r.index)]
    handles = [broadcast_async_(broadcast_view(t, root), root_rank,
                                name=f"broadcast_optimizer_state.{i}", process_set=process_set)
               for i, t in enumerate(tensors)]
    for h in handles:
        h.wait()
    if not root:
        optimizer.load_state_dict(_fill(skeleton, tensors))
    if empties[root_rank] and not all(empties.values()):
        # Root (and the ranks without state) took the initialising step, the
        # ranks with state did not: root's parameters are the ones to keep.
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for h in [broadcast_async_(broadcast_view(p.data, root), root_rank,
                                   name=f"broadcast_optimizer_state.param.{i}",
                                   process_set=process_set)
                  for i, p in enumerate(params)]:
            h.wait()
    state = optimizer.__dict__.get("_gradflow")
    if state is not None:  # equal values now: earlier differences no longer matter
        restart_crc(state)


def _collect_refs(obj: Any, out: List[_TensorRef]) -> None:
    if isinstance(obj, _TensorRef):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_refs(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_refs(v, out)


def _init_empty_state(optimizer: torch.optim.Optimizer, model: Optional[torch.nn.Module]) -> None:
    """Horovod's initialisation of a fresh optimizer, reproduced because a
    Horovod script's numbers depend on it: every parameter that requires a
    gradient gets a zero gradient, then the optimizer's own step runs once,
    locally (a DistributedOptimizer's synchronizing step would deadlock
    unless every rank called it). Adam's step count is then 1, SGD's
    momentum buffers exist, and weight decay moves the parameters once,
    exactly as under Horovod; `p.grad` is a zero tensor afterwards, not None.
    A gradient that is a view of a gradflow pool is zeroed in place so the
    pool keeps it."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            make_sparse = isinstance(optimizer, torch.optim.SparseAdam) or (
                isinstance(optimizer, torch.optim.SGD) and id(p) in sparse)
            if p.grad is not None and not p.grad.is_sparse and not make_sparse:
                with torch.no_grad():
                    p.grad.zero_()
            else:
                zero = torch.zeros_like(p)
                p.grad = zero.to_sparse() if make_sparse else zero
    if hasattr(optimizer, "_gradflow"):  # gradflow's wrapper: the wrapped class's step
        super(type(optimizer), optimizer).step()
    else:
        optimizer.step()
