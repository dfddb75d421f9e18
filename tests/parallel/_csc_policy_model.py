"""numpy model of CSC with error feedback (and the auto sparse policy's
dense steps), for sparse_policy_script.py and torch_csc_script.py: per rank
residual; importance = float32 L1 of residual + gradient per chunk (sampled:
the residual-in-pool estimate), summed over ranks; top-k by (importance
desc, index asc); the chosen chunks averaged, the rest kept. A dense step
(the policy's choice, given) sends every chunk, residual included, and
leaves every residual zero. An overflow (non-finite summed importance)
sends nothing and keeps every residual."""
from __future__ import annotations

import math

import numpy as np
import torch

from _csc_sample import sample_blocks

# The pool starts every parameter's range on a 64-byte boundary (16 float32
# elements; Note [Aligned pool ranges] in gradflow/torch/optimizer_state.py):
# flat vectors here use the pool's layout, padding (always zero) included.
ALIGN = 16


def padded(n):
    return -(-n // ALIGN) * ALIGN


def pack(tensors):
    """Flat float32 vector of `tensors` in pool layout (zero padding)."""
    out = np.zeros(sum(padded(t.numel()) for t in tensors), np.float32)
    off = 0
    for t in tensors:
        out[off:off + t.numel()] = t.detach().reshape(-1).numpy()
        off += padded(t.numel())
    return out


def layout(opt, chunk):
    """(params in pool order, bucket bounds) of a built single pool."""
    from gradflow import _native
    s = opt._gradflow
    assert len(s.pools) == 1, "one float32 pool expected"
    pool = s.pools[0]
    off = {id(p): (s.range_of[id(p)][2].data_ptr() - pool.buf.data_ptr()) // 4 for p in s.params}
    order = sorted(s.params, key=lambda p: off[id(p)])
    starts = list(_native.pool_bucket_offsets(pool.id)) + [pool.buf.numel()]
    return order, list(zip(starts[:-1], starts[1:]))


def pool_residual(opt, order):
    """This rank's residual (the pool P) in pool order."""
    s = opt._gradflow
    return pack([s.range_of[id(p)][2] for p in order])


def chunk_l1(x, c, sampled, phase, chunk):
    x = np.abs(x.astype(np.float64))
    if not sampled:
        return np.float32(x.sum())
    parts = sample_blocks(c, len(x), chunk, phase)
    n = sum(hi - lo for lo, hi in parts)
    return np.float32(sum(x[lo:hi].sum() for lo, hi in parts) * len(x) / n)


class CscModel:
    def __init__(self, bounds, ratio, sampled, chunk, n):
        self.bounds, self.ratio, self.sampled, self.chunk, self.n = bounds, ratio, sampled, chunk, n
        self.res = None
        self.phase = 0  # sparse-path steps so far (the sample phase; a dense choice counts)

    def step(self, grads, dense=False):
        """grads: N float32 vectors; returns (averaged output, overflowed)."""
        C = self.chunk
        if self.res is None:
            self.res = [np.zeros_like(g) for g in grads]
        xs = [r + g for r, g in zip(self.res, grads)]
        plans = []
        for lo, hi in self.bounds:
            nch = math.ceil((hi - lo) / C)
            imp = np.zeros(nch, np.float32)
            for x in xs:
                imp += np.array([chunk_l1(x[lo + c * C:min(lo + (c + 1) * C, hi)], c, self.sampled,
                                          self.phase, C) for c in range(nch)], np.float32)
            k = nch if dense else max(1, min(math.ceil(self.ratio * nch), nch))
            plans.append((lo, hi, sorted(sorted(range(nch), key=lambda c: (-imp[c], c))[:k]), imp))
        self.phase += 1
        if any(not np.isfinite(imp).all() for *_, imp in plans):
            return None, True
        out = np.zeros_like(grads[0])
        for lo, hi, chosen, _ in plans:
            for c in chosen:
                a, b = lo + c * C, min(lo + (c + 1) * C, hi)
                tot = np.zeros(b - a, np.float32)
                for x in xs:
                    tot += x[a:b]
                out[a:b] = tot * np.float32(1.0 / self.n)
                for x in xs:
                    x[a:b] = 0
        self.res = xs
        return out, False


def rank_grads(model, order, step, loss_fn, n):
    """Every rank's flat gradient (pool order) for `step`, computed here."""
    out = []
    for r in range(n):
        model.zero_grad()
        loss_fn(model, step, r).backward()
        out.append(pack([p.grad for p in order]))
    return out


def set_grads(params, vec):
    off = 0
    for p in params:
        p.grad = torch.from_numpy(vec[off:off + p.numel()].copy()).view(p.shape)
        off += padded(p.numel())
