# optimizer_setup.py — set-up of a torch DistributedOptimizer wrapper: the
# argument checks, the per-wrapper state (_State), which parameters are
# registered (trainable ones; frozen ones wait, Note [Late parameters]),
# the copy-path / pool / one-rank decision, the cross-rank check that every
# rank wraps the same parameters, and the post-accumulate-grad hooks. The
# step protocol is optimizer.py's; no communication here except that check.
"""`setup_optimizer(opt, ...)`: called once by DistributedOptimizer()
(distributed_optimizer.py) on the freshly built wrapper."""
from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Dict

import torch

from .. import _native
from .. import _runtime
from ..collectives import Adasum, Average, check_adasum_options, reduce_op
from ..elastic import worker as _elastic_worker
from ..process_sets import member_id, process_set_size
from ..settings_check import native_sparse_ratio, pool_bucket_bytes
from . import hyperparameter_check as _hyper_check
from .compression import split as split_compression
from .functions import check_same_everywhere
from .optimizer_groups import GroupTracker, form_groups
from .optimizer_state import _LIVE, _State, destroy_pools, parameter_names

# Per process set (collective names): other sets must not shift the numbers.
_instances: Dict[int, "itertools.count"] = {}


def setup_optimizer(wrapper, named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, sparse_ratio, use_pool, bucket_mb,
                    sparse_as_dense, grad_scaler=None, groups=None,
                    process_set=None, overlap=True) -> None:
    """Checks the arguments (ValueError on every rank alike) and registers
    `wrapper`'s parameters and hooks; see DistributedOptimizer()."""
    s = wrapper._gradflow = _State()
    _hyper_check.reset(s)  # counted from 0 on every rank (and after each join())
    if not isinstance(overlap, bool):
        raise ValueError(f"gradflow: overlap must be True or False, got {overlap!r}")
    # The limits of GRADFLOW_SPARSE_RATIO / GRADFLOW_POOL_BUCKET_BYTES, whose
    # meaning these keywords have (settings_check.py): bucket_mb=0 or -1 used
    # to mean the default silently, and 0.001 MiB buckets under the 4096 bytes
    # the variable allows passed.
    ratio = native_sparse_ratio(sparse_ratio, "DistributedOptimizer")
    bucket_bytes = pool_bucket_bytes(bucket_mb, "DistributedOptimizer")
    s.overlap = overlap
    s.runtime_gen = _runtime.generation()
    op = reduce_op(op)  # Horovod meaning of raw ints; unknown ones raise here
    # Every gradient, pool and check runs in the set's engine (Note [Process sets]).
    s.ps, s.process_set = member_id(process_set, "DistributedOptimizer"), process_set
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradflow: gradient_predivide_factor != 1.0 needs op=Average")
    # A pool bucket holds several gradients; Adasum needs one dot product
    # per gradient, so Adasum gradients stay on the copy path.
    use_pool = use_pool and op != Adasum
    if backward_passes_per_step < 1:
        raise ValueError("gradflow: backward_passes_per_step must be >= 1")
    s.op, s.bpps, s.sparse_as_dense = op, int(backward_passes_per_step), sparse_as_dense
    s.wire, user_compressor = split_compression(compression)
    check_adasum_options(op, s.wire, sparse_ratio, "DistributedOptimizer")
    s.compression = compression
    s.prescale = 1.0 / gradient_predivide_factor
    s.postscale = float(gradient_predivide_factor)
    s.sparse_ratio = ratio  # -1.0: GRADFLOW_SPARSE_RATIO
    # CSC in effect (explicit or GRADFLOW_SPARSE_RATIO): residuals exist.
    s.csc = op != Adasum and (s.sparse_ratio if s.sparse_ratio > 0
                              else _native.config()["sparse_ratio"]) < 1.0
    if grad_scaler is not None and not callable(getattr(grad_scaler, "get_scale", None)):
        raise ValueError("gradflow: grad_scaler must be a torch.amp.GradScaler (or have "
                         "get_scale()), got " + type(grad_scaler).__name__)
    s.scaler = grad_scaler
    s.bucket_bytes = bucket_bytes  # -1: GRADFLOW_POOL_BUCKET_BYTES
    s.prefix = f"DistributedOptimizer{next(_instances.setdefault(s.ps, itertools.count()))}"

    seen = set()
    for group in wrapper.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                if p.requires_grad:
                    s.index[id(p)] = len(s.params)
                    s.params.append(p)
                else:
                    s.frozen.append(p)
    s.names = parameter_names(s, wrapper.param_groups, named_parameters)
    _check_parameters(s, op)
    formed = form_groups(s.params, groups)
    s.groups = None if formed is None else GroupTracker(formed)
    # A user Compressor runs in Python around each gradient's allreduce,
    # and groups go out as grouped allreduces: both need the copy path
    # (the pool's buckets are reduced in place by the core).
    s.use_pool = use_pool and all(p.device.type == "cpu" for p in s.params) \
        and user_compressor is None and s.groups is None
    # One rank (Note [One rank]): the reduced gradient is the gradient.
    s.wanted, s.user_compressor = (s.use_pool, s.csc), user_compressor
    s.solo = process_set_size(process_set, "DistributedOptimizer") == 1 and user_compressor is None
    if s.solo:
        s.use_pool = s.csc = False
    if use_pool and not all(p.device.type == "cpu" for p in s.params):
        warnings.warn("gradflow: the gradient pool is CPU-only; CUDA parameters use the copy path")
    if _elastic_worker.current() is None:
        # Skipped in elastic mode: a joining worker builds its
        # optimizer while the running ones are in State.sync(), so no
        # collective may run here (a mismatch fails at the first step).
        check_same_everywhere([(n, tuple(p.shape), str(p.dtype))
                               for n, p in zip(s.names, s.params)],
                              f"DistributedOptimizer '{s.prefix}'", process_set)
    me = weakref.ref(wrapper)  # hooks must not keep the optimizer alive

    def hook(p: torch.Tensor) -> None:
        opt = me()
        if opt is not None:
            opt._gradflow_hook(p)

    s.hook = hook
    _warn_if_shared(s)
    s.hook_handles = [p.register_post_accumulate_grad_hook(hook) for p in s.params]
    wrapper._gradflow_finalizer = weakref.finalize(wrapper, destroy_pools, [])


def _warn_if_shared(s) -> None:
    """Note [Two live wrappers]: a parameter that another live
    DistributedOptimizer of this runtime already reduces (a second
    optimizer made for a new training phase while the first is still
    referenced, e.g. by its LR scheduler): both wrappers' hooks fire, so
    its gradient is reduced twice every step (twice the traffic; with an
    op other than Average the old wrapper raised "a backward pass ran
    after this step's gradients were reduced", naming the old optimizer).
    Found by the 2026-11-29 combination audit; warned on every rank alike
    (every rank wraps the same parameters)."""
    mine = {id(p) for p in s.params}
    for other in list(_LIVE):
        if (other is s or other.runtime_gen != s.runtime_gen
                or not getattr(other, "hook_handles", None)):
            continue
        shared = [other.names[i][len(other.prefix) + 1:] for i, p in enumerate(other.params)
                  if id(p) in mine]
        if shared:
            warnings.warn(
                f"gradflow: {s.prefix} wraps {len(shared)} parameter(s) that {other.prefix}, a "
                f"DistributedOptimizer still alive, also reduces (first: '{shared[0]}'): both "
                "reduce their gradients every backward. Drop every reference to the old "
                "optimizer (and its LR scheduler) before wrapping a new one", stacklevel=3)


def _check_parameters(s, op) -> None:
    """What no reduction can take, refused here on every rank alike (every
    rank wraps the same parameters) rather than inside the first backward."""
    for name, p in zip(s.names, s.params):
        name = name[len(s.prefix) + 1:]  # the user's name, without "<prefix>."
        if p.device.type == "meta":
            # A model built on the meta device and materialized later
            # (to_empty) gets new parameter objects: these would never see a
            # gradient (the first step failed with "no backward pass produced a
            # gradient", after a warning about CUDA parameters).
            raise ValueError(f"gradflow: DistributedOptimizer: parameter '{name}' is on the meta "
                             "device (it has no data); create the optimizer over the materialized "
                             "parameters (after to_empty() / loading the weights)")
        if p.is_complex() and op == Adasum:  # Note [Complex gradients]: reduced as float pairs
            raise ValueError(f"gradflow: DistributedOptimizer: op=Adasum of the complex parameter "
                             f"'{name}' is not supported (its real and imaginary parts would be "
                             "combined as one real vector)")
