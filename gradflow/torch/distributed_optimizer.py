# distributed_optimizer.py — the public DistributedOptimizer() factory:
# Horovod's signature and the user-facing documentation of every keyword;
# builds the wrapper (a dynamic subclass of the user's optimizer class with
# _DistributedOptimizer's methods, optimizer.py) and hands it its set-up.
from __future__ import annotations

import warnings
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

import torch

from ..collectives import Average
from ..process_sets import ProcessSet, global_process_set
from .compression import Compression
from .optimizer import _DistributedOptimizer
from .optimizer_setup import setup_optimizer
from .optimizer_state import repatch_scheduler_step

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0,
                         groups: Optional[Union[int, Sequence[Sequence[torch.Tensor]]]] = None,
                         sparse_as_dense: bool = False,
                         process_set: Optional[ProcessSet] = global_process_set, *,
                         sparse_ratio: Optional[float] = None,
                         use_pool: bool = True, bucket_mb: Optional[float] = None,
                         grad_scaler: Optional["torch.amp.GradScaler"] = None,
                         overlap: bool = True) -> torch.optim.Optimizer:
    """Wrap `optimizer` so gradients are averaged (op) across ranks.

    Returns an instance of a subclass of the optimizer's own class (same
    param groups, state and hyperparameters), so isinstance, state_dict and
    LR schedulers keep working. Collective: every rank must wrap the same
    parameters (checked; a mismatch raises GradflowError on every rank).

    Horovod's parameters keep Horovod's order; gradflow's own (sparse_ratio,
    use_pool, bucket_mb, grad_scaler, overlap) are keyword-only after them.

    compression: Compression.none / .fp16 / .bf16 (16-bit wire, fp32 sums),
      or a user Compressor (Horovod's compress/decompress interface), applied
      around each gradient's allreduce (copy path: no pool).
    backward_passes_per_step: gradients accumulate locally for that many
      backward passes; the last one submits. A rank that calls join() in the
      middle of a step (its data ended after fewer passes) drops that step,
      with a warning: call step() first to apply those passes (Note
      [Unfinished step at join] in optimizer_state.py).
    gradient_predivide_factor: scale by 1/f before the sum and f after.
    groups: Horovod's explicit grouping: an int n splits the parameters into
      n groups, a list of lists of parameters makes each list a group (and
      each parameter in no list its own). A group's gradients go out
      together, as one grouped allreduce, once all of them are ready. Groups
      use the copy path (the pool's buckets are the ungrouped equivalent),
      and sparse_ratio as the copy path does (one CSC residual per gradient).
    num_groups: deprecated in Horovod (DeprecationWarning); used as `groups`
      when `groups` is None.
    sparse_ratio: CSC sparse communication ratio (None: GRADFLOW_SPARSE_RATIO),
      1e-6 <= value <= 1 as for the variable; 1 is dense.
      Error feedback loses nothing: what a step does not send stays in a
      residual and goes out on a later step. Step 1 runs before the pool
      exists and is dense (it counts as a GRADFLOW_SPARSE_WARMUP_STEPS step).
      On the pool path (float32, no grad_scaler=, no sparse momentum) the
      residual is the pool itself and a step costs CPU in proportion to the
      chunks sent; what param.grad holds then:
        * from zero_grad() to the end of synchronize() (so during backward
          and in the hooks): a view of the pool = the residual (gradient not
          sent in earlier steps) + this step's gradients. zero_grad() writes
          nothing. synchronize() runs when the step's last backward returns
          (Note [Reduced when backward returns]), so code between backward()
          and step() sees the reduced gradient.
        * after synchronize() / step(): the averaged gradient of the chunks
          sent this step, zero elsewhere (what the optimizer applies). It
          may be modified in place (clipping, unscale_, weight decay): one
          full zeroing of it next step is the only cost.
        * a p.grad replaced meanwhile (model.zero_grad(), assignment) is
          added into the pool at the hook; without any zero_grad() torch's
          accumulation onto last step's param.grad is kept (it is added too).
      Chunks are chosen by an estimate of their L1 norm from a 1/8 sample
      (the same on every rank; it rotates, covering each chunk in 8 steps). If the sampled importance has an
      inf/NaN, nothing is sent, every rank gets non-finite values in those
      chunks, and those chunks of the residual are dropped (an inf outside
      the sample reaches param.grad when its chunk is sent). With
      grad_scaler=, sparse momentum or use_pool=False the classic residual
      is used instead (one per gradient element plus a spare of the same
      size; all chunks' exact norms): on inf/NaN the residual is left as it
      was, and with grad_scaler= a step the scaler skipped because of an
      overflow in *another* bucket or tensor has the finite buckets'
      residuals rolled back too (Note [A skipped step owes its chunks]), so
      a GradScaler skip loses nothing (before 2026-11-27 the chunks those
      buckets sent in the skipped step were lost).
    grad_scaler: with CSC and AMP, pass the GradScaler whose scale the
      gradients carry: the residual is then kept in unscaled units (the
      reduced gradient still comes back scaled, for scaler.unscale_). Without
      it the residual holds gradients at the loss scale of the step that
      produced them. Without CSC only the hyperparameter check (below) reads it.
    use_pool: lazy allreduce over a contiguous gradient pool (zero copy).
    bucket_mb: pool bucket size in MiB (None: GRADFLOW_POOL_BUCKET_BYTES, 8 MiB);
      the variable's limits apply: at least 4096 bytes (0.00390625 MiB).
    sparse_ratio and bucket_mb are checked at construction against the limits
      of their GRADFLOW_* variables (GradflowValueError, a ValueError, naming
      the keyword, the value and the accepted range).
    overlap: True (default) submits each gradient from its hook, during
      backward. False defers every submission to synchronize()/step(), in
      backward order (benchmarks/ablation.py's "no overlap" step): same pool
      and buckets, same values (bitwise on the pool path; copy-path fusion may regroup).
    sparse_as_dense: densify sparse gradients instead of allgathering them.
      Without it, the ranks agree at the first step which parameters have
      sparse gradients (some rank's gradient was sparse); those are
      allgathered from then on, a rank without the gradient in a step
      contributing an empty one, and any other parameter is reduced dense
      (an embedding no rank used in the first step included: its sparse
      gradients are densified, so SparseAdam would then see dense ones).
      Allgathers cannot run while a rank has joined: with join(), pass
      sparse_as_dense=True (else the ranks still training fail those steps,
      and the next join() raises on every rank: sparse_join.py).
    op=Adasum: each gradient is Adasum-combined, then the wrapped step runs
      (Horovod Adasum-combines the wrapped step's deltas instead: the same for
      plain SGD, not for momentum/Adam; docs/horovod_compat.md). Copy path
      (use_pool ignored), compression none, power-of-two rank counts.
    Hyperparameters: every rank must train with the same learning rate,
      momentum, weight decay, ... (else the weights drift apart). Every 16th
      step's allreduces carry a CRC of every step's values since the last
      check (hyperparameter_check.py); a difference fails the job on every
      rank with both ranks' values (ReduceLROnPlateau on a rank-local loss:
      average the metric first). So does a parameter frozen after wrapping
      (requires_grad=False) on some ranks only, and a rank whose step() count
      differs at the same reduction round (an extra backward pass before a
      step(), or a step() skipped after its reduction, on some ranks only),
      and so does an AMP GradScaler whose scale (or growth state) differs
      between ranks (one resumed from a checkpoint on rank 0 only): the one
      given as grad_scaler=, else the one found calling step()
      (scaler.step(opt)), from the step after.
    Gradients assigned by hand (param.grad set from torch.autograd.grad or
      functorch, no backward) are reduced in step(), as Horovod's
      synchronize() reduces them. step() with neither a backward nor an
      assigned gradient since the last step/zero_grad() raises GradflowError,
      on every rank when only some ranks skipped their backward.
    One rank (the process set has one member): plain torch, bit for bit —
      no pool, no wire cast, no CSC, nothing sent (Note [One rank] in optimizer.py).
    process_set: reduce over this registered ProcessSet's members only
      (Average divides by its size); only members may wrap, and every
      member must (the pool, CSC and the 16-bit wire work in a set as on
      all ranks).
    """
    if "_gradflow" in getattr(optimizer, "__dict__", {}):
        # Both wrappers' hooks would reduce every gradient: the second one's
        # step() then failed with "no backward pass produced a gradient".
        raise ValueError("gradflow: DistributedOptimizer: this optimizer is already a gradflow "
                         "DistributedOptimizer; wrap the torch optimizer once")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` (as in Horovod)",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    base = optimizer.__class__
    cls = type(base.__name__, (base,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # same groups, state, defaults, hooks
    repatch_scheduler_step(wrapped, optimizer)
    setup_optimizer(wrapped, named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, sparse_ratio, use_pool, bucket_mb,
                    sparse_as_dense, grad_scaler, groups, process_set, overlap)
    return wrapped
