# torch_csc_script.py — SPMD: coarse-grained sparse communication (CSC) in
# DistributedOptimizer, against a numpy model of CSC with error feedback run
# on rank 0 (every rank's gradient recomputed there), over many SGD steps on
# the multi-bucket pool path: the residual kept in the pool (importance from
# the native sample, followed by the model) with every zero_grad flavour, an
# unused parameter, accumulation and in-place writes into param.grad; AMP
# overflow steps on the classic path (grad_scaler=); residual bookkeeping.
# Run with GRADFLOW_SPARSE_CHUNK=64 GRADFLOW_SPARSE_WARMUP_STEPS=0.
import gc

import numpy as np
import torch
import torch.nn.functional as F

import gradflow
import gradflow.torch as hvd
from gradflow import _native
from _csc_policy_model import CscModel, layout, pack, rank_grads, set_grads  # shared with the policy test
from _torch_common import assert_close, assert_identical, batch, digits, expect_error, flat, mlp, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER, LR, CHUNK = 16, 0.1, 64
assert _native.config()["sparse_chunk"] == CHUNK and _native.config()["sparse_warmup_steps"] == 0


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
            order, bounds = layout(opt, CHUNK)
            assert (len(bounds) > 1) == (bucket_mb is not None), bounds
            assert opt._gradflow.pools[0].out is not None, "residual in the pool expected"
    assert gradflow.stats().get("sparse.in_pool_steps", 0) > 0
    assert_identical(m.parameters(), f"csc ratio {ratio}")
    if R == 0:
        ref = mlp()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        ref_order = [dict(ref.named_parameters())[n] for n in
                     [k for p in order for k, q in m.named_parameters() if q is p]]
        csc = CscModel(bounds, ratio, True, CHUNK, N)
        for step in range(STEPS):
            grads = rank_grads(ref, ref_order, step, plain_loss, N)
            out = np.mean(grads, 0, dtype=np.float32) if step == 0 else csc.step(grads)[0]
            set_grads(ref_order, out)
            ref_opt.step()
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"csc ratio {ratio}", 1e-5)
    # One residual element per pool element (gradients and their alignment
    # padding; no leftover per-name ones).
    assert _native.sparse_residual_elements() == opt._gradflow.pools[0].buf.numel(), \
        (_native.sparse_residual_elements(), "residual elements != pool elements")
    ok(f"csc pool path matches numpy model (ratio {ratio}, {len(bounds)} buckets)")
    del opt
    gc.collect()
    assert _native.sparse_residual_elements() == 0, "residuals outlived their optimizer"
ok("csc residuals freed with the optimizer")

# 1b. Residual in the pool, the awkward protocol: two backward passes per
# step, a head unused on every rank but 0, each zero_grad flavour (and none:
# torch then accumulates onto last step's reduced gradient, which the pool
# must take in), clipping and an in-place weight decay written into
# param.grad after synchronize() (G's version guard must zero all of it).
class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.extra = mlp(), torch.nn.Linear(64, 3)

    def forward(self, x, use_extra):
        out = self.body(x)
        return out, (self.extra(x).pow(2).mean() if use_extra else None)


def two_head_loss(model, step, r, half):
    xb, yb = batch(X, Y, 2 * step + half, r, N, PER // 2)
    out, extra = model(xb, use_extra=(r == 0))
    loss = F.cross_entropy(out, yb)
    return loss if extra is None else loss + extra


FLAVOURS = ["opt", "model_none", "none", "model_zero", "opt", "none", "model_none", "opt", "none"]
CLIP, DECAY = {2: 0.05, 6: 0.05}, {3: 1e-3, 7: 1e-3}
torch.manual_seed(1)
m = TwoHeads()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(),
                               sparse_ratio=0.2, bucket_mb=0.004, backward_passes_per_step=2)


def after_sync(model, step):
    if step in CLIP:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP[step])
    if step in DECAY:
        for p in model.parameters():
            p.grad.add_(p.detach(), alpha=DECAY[step])


for step, flavour in enumerate(FLAVOURS):
    if flavour == "opt":
        opt.zero_grad()
    elif flavour == "model_none":
        m.zero_grad()
    elif flavour == "model_zero":
        m.zero_grad(set_to_none=False)
    for half in range(2):
        two_head_loss(m, step, R, half).backward()
    opt.synchronize()
    after_sync(m, step)
    with opt.skip_synchronize():
        opt.step()
assert all(pool.out is not None for pool in opt._gradflow.pools)
assert_identical(m.parameters(), "csc residual in pool, awkward protocol")
if R == 0:
    order, bounds = layout(opt, CHUNK)
    assert len(bounds) > 1, bounds
    torch.manual_seed(1)
    ref = TwoHeads()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    names = [k for p in order for k, q in m.named_parameters() if q is p]
    ref_order = [dict(ref.named_parameters())[n] for n in names]
    csc, prev = CscModel(bounds, 0.2, True, CHUNK, N), None
    for step, flavour in enumerate(FLAVOURS):
        grads = []
        for r in range(N):
            ref.zero_grad()
            for half in range(2):
                two_head_loss(ref, step, r, half).backward()
            g = pack([p.grad if p.grad is not None else torch.zeros_like(p) for p in ref_order])
            # no zeroing: torch accumulates onto last step's (reduced) param.grad
            grads.append(g + prev if flavour == "none" and prev is not None else g)
        out = np.mean(grads, 0, dtype=np.float32) if step == 0 else csc.step(grads)[0]
        set_grads(ref_order, out)
        after_sync(ref, step)
        prev = pack([p.grad for p in ref_order])
        ref_opt.step()
    assert_close(flat(m.parameters()), flat(ref.parameters()), "csc residual in pool, awkward", 1e-5)
ok("csc residual in pool: zero_grad flavours, unused head, accumulation, writes into grad")
del opt
gc.collect()

# 2. AMP: autocast(bf16) + GradScaler + CSC; rank 1 overflows on step 3. The
# scaler must skip exactly that step, the residual (kept in unscaled units)
# must come out as if the step never happened, and later steps go on. Twice:
# the whole loss overflows (every bucket sees it), and only the last layer's
# bias does, with 4 KiB pool buckets, so the other buckets are finite and
# send their chunks in the step the scaler then skips: those must stay owed
# (Note [A skipped step owes its chunks]; they used to be lost). Also on the
# copy path (use_pool=False: one named residual per parameter).
def amp_case(confined, copy=False):
    m = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(),
                                   sparse_ratio=0.1, grad_scaler=scaler,
                                   **({"use_pool": False} if copy else
                                      {"bucket_mb": 0.004} if confined else {}))

    def amp_loss(model, step, r):
        xb, yb = batch(X, Y, step, r, N, PER)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(xb), yb)
        if step == 3 and r == 1:
            return loss + model[2].bias.sum() * float("inf") if confined else loss * float("inf")
        return loss

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
        if copy:  # per-parameter residuals: each its own chunked buffer
            order = list(m.parameters())
            ends = np.cumsum([p.numel() for p in order]).tolist()
            bounds = list(zip([0] + ends[:-1], ends))
        else:
            order, bounds = layout(opt, CHUNK)
            assert len(bounds) > 1 if confined else len(bounds) == 1, bounds
            assert opt._gradflow.pools[0].out is None, "grad_scaler= keeps the classic residual"
        ref = mlp()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
        ref_order = [dict(ref.named_parameters())[n] for n in
                     [k for p in order for k, q in m.named_parameters() if q is p]]
        csc = CscModel(bounds, 0.1, False, CHUNK, N)
        for step in range(STEPS):
            S = scales[step]
            grads = [g / np.float32(S) for g in
                     rank_grads(ref, ref_order, step, lambda mm, st, r: amp_loss(mm, st, r) * S, N)]
            if step == 0 and not copy:  # the pool path's step 1 is dense
                out, overflow = np.mean(grads, 0, dtype=np.float32), False
            else:
                out, overflow = csc.step(grads)  # an overflow anywhere keeps every residual
            if not overflow:
                set_grads(ref_order, out)
                ref_opt.step()
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"csc amp {confined} {copy}",
                     1e-5)
    del opt
    gc.collect()


amp_case(confined=False)
amp_case(confined=True)
amp_case(confined=True, copy=True)
ok("csc + GradScaler: one skipped step, residual unscaled and kept, every bucket's")

# 3. A named sparse allreduce whose size changes is refused on every rank
# (its residual would be lost), and the runtime keeps working.
gradflow.allreduce(np.ones(100, np.float32), name="csc.grow", sparse_ratio=0.5)
expect_error(lambda: gradflow.allreduce(np.ones(50, np.float32), name="csc.grow", sparse_ratio=0.5),
             "csc.grow", "would be lost")
assert hvd.allreduce(torch.ones(3), name="csc.after", op=hvd.Sum).tolist() == [N] * 3
ok("csc size change refused, runtime usable")
