# gradflow/torch/optimizer_autotune.py — connects DistributedOptimizer's
# step boundary to the framework-free autotuner (gradflow/autotune.py).
"""Autotune for the torch DistributedOptimizer: after each synchronize()
(every bucket waited, pools reset: nothing of this optimizer in flight) the
tuner times the step and, at the end of a sample, applies the agreed next
setting, re-cutting this optimizer's pools."""

from __future__ import annotations

import torch

from .. import _native
from .. import autotune as _autotune


def after_synchronize(opt) -> None:
    """Step boundary of `opt` (a DistributedOptimizer)."""
    s = opt._gradflow
    tuner = getattr(s, "autotuner", None)
    if tuner is None:
        if getattr(s, "autotune_off", False):
            return
        if not _autotune.enabled() or not _autotune.claim(opt, s.process_set):
            s.autotune_off = True
            return
        if s.use_pool and not s.pool_built:
            return  # the pools appear after step 1; tune from then on
        ranges = [[] for _ in s.pools]
        for pool_index, r, view in sorted(s.range_of.values(), key=lambda x: (x[0], x[1])):
            ranges[pool_index].append(view.numel() * view.element_size())
        # Pools with separate CSC residuals (sparse momentum, grad_scaler)
        # keep them per bucket: their cut stays as built.
        can_rebucket = not s.csc or all(p.out is not None or p.buf.dtype != torch.float32
                                        for p in s.pools)
        bucket = s.bucket_bytes if s.bucket_bytes >= 0 else _native.config()["pool_bucket_bytes"]
        tuner = s.autotuner = _autotune.Autotuner([p.id for p in s.pools], ranges, bucket,
                                                  can_rebucket, s.process_set)
    tuner.step_end()
