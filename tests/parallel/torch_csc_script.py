# torch_csc_script.py — SPMD: coarse-grained sparse communication (CSC) in
# DistributedOptimizer, against a numpy model of CSC with error feedback run
# on rank 0 (every rank's gradient recomputed there), over many SGD steps on
# the multi-bucket pool path; AMP overflow steps; residual bookkeeping.
# Run with GRADFLOW_SPARSE_CHUNK=64 GRADFLOW_SPARSE_WARMUP_STEPS=0.
import gc
import math

import numpy as np
import torch
import torch.nn.functional as F

import gradflow
import gradflow.torch as hvd
from gradflow import _native
from _torch_common import assert_close, assert_identical, batch, digits, expect_error, flat, mlp, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER, LR, CHUNK = 16, 0.1, 64
assert _native.config()["sparse_chunk"] == CHUNK and _native.config()["sparse_warmup_steps"] == 0


def layout(opt):
    """(params in pool order with their pool offsets, bucket bounds) of a built pool."""
    s = opt._gradflow
    assert len(s.pools) == 1, "one float32 pool expected"
    pool = s.pools[0]
    where = sorted((slot[2].data_ptr() - pool.buf.data_ptr()) // 4 for slot in s.range_of.values())
    by_off = {(s.range_of[id(p)][2].data_ptr() - pool.buf.data_ptr()) // 4: p for p in s.params}
    starts = list(_native.pool_bucket_offsets(pool.id)) + [pool.buf.numel()]
    return [by_off[o] for o in where], list(zip(starts[:-1], starts[1:]))


class CscModel:
    """numpy CSC: per rank residual; importance = float32 L1 of residual + grad
    per chunk, summed over ranks; top-k by (importance desc, index asc); the
    chosen chunks averaged, the rest kept. An overflow (non-finite global
    importance) sends nothing and leaves every residual as it was."""

    def __init__(self, bounds, ratio):
        self.bounds, self.ratio = bounds, ratio
        self.res = None

    def step(self, grads):  # grads: N float32 vectors; returns (averaged output, overflowed)
        if self.res is None:
            self.res = [np.zeros_like(g) for g in grads]
        out = np.zeros_like(grads[0])
        xs = [r + g for r, g in zip(self.res, grads)]
        plans = []
        for lo, hi in self.bounds:
            nch = math.ceil((hi - lo) / CHUNK)
            imp = np.zeros(nch, np.float32)
            for x in xs:
                per = [np.abs(x[lo + c * CHUNK:min(lo + (c + 1) * CHUNK, hi)].astype(np.float64)).sum()
                       for c in range(nch)]
                imp += np.array(per, np.float32)
            plans.append((lo, hi, nch, imp))
        if any(not np.isfinite(imp).all() for *_, imp in plans):
            return None, True
        for lo, hi, nch, imp in plans:
            k = max(1, min(math.ceil(self.ratio * nch), nch))
            chosen = sorted(sorted(range(nch), key=lambda c: (-imp[c], c))[:k])
            for c in range(nch):
                a, b = lo + c * CHUNK, min(lo + (c + 1) * CHUNK, hi)
                if c in chosen:
                    tot = np.zeros(b - a, np.float32)
                    for x in xs:
                        tot += x[a:b]
                    out[a:b] = tot * np.float32(1.0 / N)
        for i, x in enumerate(xs):
            self.res[i] = x
            for lo, hi, nch, imp in plans:
                k = max(1, min(math.ceil(self.ratio * nch), nch))
                for c in sorted(range(nch), key=lambda c: (-imp[c], c))[:k]:
                    self.res[i][lo + c * CHUNK:min(lo + (c + 1) * CHUNK, hi)] = 0
        return out, False


def rank_grads(model, order, step, loss_fn):
    """Every rank's flat gradient (pool order) for `step`, computed here."""
    out = []
    for r in range(N):
        model.zero_grad()
        loss_fn(model, step, r).backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in order]).numpy().astype(np.float32))
    return out


def set_grads(params, vec):
    off = 0
    for p in params:
        p.grad = torch.from_numpy(vec[off:off + p.numel()].copy()).view(p.shape)
        off += p.numel()


def plain_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    return F.cross_entropy(model(xb), yb)


# 1. Multi-bucket pool, SGD with momentum, 10 steps: step 1 dense, then CSC.
for ratio, bucket_mb in ((0.25, 0.004), (0.05, None)):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9),
                                   m.named_parameters(), sparse_ratio=ratio, bucket_mb=bucket_mb)
    STEPS = 10
    for step in range(STEPS):
        opt.zero_grad()
        plain_loss(m, step, R).backward()
        opt.step()
        if step == 0:
            order, bounds = layout(opt)
            assert (len(bounds) > 1) == (bucket_mb is not None), bounds
    assert_identical(m.parameters(), f"csc ratio {ratio}")
    if R == 0:
        ref = mlp()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        ref_order = [dict(ref.named_parameters())[n] for n in
                     [k for p in order for k, q in m.named_parameters() if q is p]]
        csc = CscModel(bounds, ratio)
        for step in range(STEPS):
            grads = rank_grads(ref, ref_order, step, plain_loss)
            out = np.mean(grads, 0, dtype=np.float32) if step == 0 else csc.step(grads)[0]
            set_grads(ref_order, out)
            ref_opt.step()
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"csc ratio {ratio}", 1e-5)
    # One residual element per gradient element (no leftover per-name ones).
    assert _native.sparse_residual_elements() == sum(p.numel() for p in m.parameters()), \
        (_native.sparse_residual_elements(), "residual elements != gradient elements")
    ok(f"csc pool path matches numpy model (ratio {ratio}, {len(bounds)} buckets)")
    del opt
    gc.collect()
    assert _native.sparse_residual_elements() == 0, "residuals outlived their optimizer"
ok("csc residuals freed with the optimizer")

# 2. AMP: autocast(bf16) + GradScaler + CSC; rank 1 overflows on step 3. The
# scaler must skip exactly that step, the residual (kept in unscaled units)
# must come out as if the step never happened, and later steps go on.
m = mlp()
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(),
                               sparse_ratio=0.1, grad_scaler=scaler)


def amp_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(xb), yb)
    return loss * float("inf") if (step == 3 and r == 1) else loss


STEPS, skipped, scales = 9, [], []
for step in range(STEPS):
    opt.zero_grad()
    before = flat(m.parameters())
    scales.append(scaler.get_scale())
    scaler.scale(amp_loss(m, step, R)).backward()
    opt.synchronize()  # reduce first, so every rank's scaler sees the same overflow
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    if torch.equal(before, flat(m.parameters())):
        skipped.append(step)
assert skipped == [3], f"skipped steps {skipped} (scales {scales}); only step 3 overflowed"
assert_identical(m.parameters(), "csc amp")
if R == 0:
    order, bounds = layout(opt)
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref_order = [dict(ref.named_parameters())[n] for n in
                 [k for p in order for k, q in m.named_parameters() if q is p]]
    csc = CscModel(bounds, 0.1)
    for step in range(STEPS):
        S = scales[step]
        grads = [g / np.float32(S) for g in
                 rank_grads(ref, ref_order, step, lambda mm, st, r: amp_loss(mm, st, r) * S)]
        if step == 0:
            out, overflow = np.mean(grads, 0, dtype=np.float32), False
        else:
            out, overflow = csc.step(grads)
        if not overflow:
            set_grads(ref_order, out)
            ref_opt.step()
    assert_close(flat(m.parameters()), flat(ref.parameters()), "csc amp", 1e-5)
ok("csc + GradScaler: one skipped step, residual unscaled and kept")
del opt
gc.collect()

# 3. A named sparse allreduce whose size changes is refused on every rank
# (its residual would be lost), and the runtime keeps working.
gradflow.allreduce(np.ones(100, np.float32), name="csc.grow", sparse_ratio=0.5)
expect_error(lambda: gradflow.allreduce(np.ones(50, np.float32), name="csc.grow", sparse_ratio=0.5),
             "csc.grow", "would be lost")
assert hvd.allreduce(torch.ones(3), name="csc.after", op=hvd.Sum).tolist() == [N] * 3
ok("csc size change refused, runtime usable")
