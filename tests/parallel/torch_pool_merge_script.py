# torch_pool_merge_script.py — SPMD: the gradient pool with many tiny buckets,
# so that several become ready in one background cycle and (with
# GRADFLOW_POOL_MERGE=1) go out as one collective. After every step's
# synchronize() the reduced gradients must be bitwise identical on every rank
# and equal a numpy reference: the mean over ranks of each rank's own
# gradient (recomputed on a twin model, gathered, averaged in float64).
# Cases: fp32 and fp16 wire, a parameter unused on one rank with
# model.zero_grad(), backward_passes_per_step=2, CSC (merged dense warm-up,
# unmerged sparse steps). Prints "merged collectives: K" for the test to check.
import copy

import numpy as np
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import batch, digest, digits, ok
from gradflow import _native

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 8
MERGE = bool(_native.config()["pool_merge"])
BUCKET_MB = 0.004  # ~4 KiB, the least bucket_mb allows (4096 bytes): ~3 16x16 layers per bucket


class Deep(torch.nn.Module):
    """Eight narrow layers (16 ranges, ~6 tiny buckets) and a branch that
    only rank 0 uses after step 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(64, 16)
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(6))
        self.out = torch.nn.Linear(16, 10)
        self.branch = torch.nn.Linear(16, 10)

    def forward(self, x, use_branch=False):
        h = torch.tanh(self.inp(x))
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return self.out(h) + self.branch(h) if use_branch else self.out(h)


def local_loss(model, step, p, bpps, branch_rank):
    xb, yb = batch(X, Y, step * bpps + p, R, N, PER)
    use = branch_rank is not None and (step == 0 or R == branch_rank)
    return F.cross_entropy(model(xb, use), yb)


def grads(model):
    return np.concatenate([(p.grad if p.grad is not None else torch.zeros_like(p))
                           .detach().double().reshape(-1).numpy() for p in model.parameters()])


def case(name, steps=5, bpps=1, branch_rank=None, model_zero_grad=False, tol=1e-6, dense_steps=None,
         **kw):
    model = Deep()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps, bucket_mb=BUCKET_MB, **kw)
    merged = []
    for step in range(steps):
        # The reference: this rank's own gradient on a twin, averaged over ranks.
        twin = copy.deepcopy(model)
        for p in range(bpps):
            local_loss(twin, step, p, bpps, branch_rank).backward()
        want = np.mean(np.stack(hvd.allgather_object(grads(twin))), axis=0)
        before = hvd.stats().get("pool.merged_collectives", 0)
        model.zero_grad() if model_zero_grad else opt.zero_grad()
        for p in range(bpps):
            local_loss(model, step, p, bpps, branch_rank).backward()
        opt.synchronize()
        merged.append(hvd.stats().get("pool.merged_collectives", 0) - before)
        got = torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])
        every = hvd.allgather_object(digest(got).tobytes())
        assert all(e == every[0] for e in every), f"{name} step {step}: gradients differ between ranks"
        if dense_steps is None or step < dense_steps:
            err = np.abs(got.double().numpy() - want).max()
            bound = tol * max(1.0, np.abs(want).max())
            assert err <= bound, f"{name} step {step}: max error {err} vs numpy mean (bound {bound})"
        with opt.skip_synchronize():
            opt.step()
    # Merge decisions come from the agreed response list: the same everywhere.
    every = hvd.allgather_object(merged)
    assert all(m == every[0] for m in every), f"{name}: ranks merged differently: {every}"
    if not MERGE:
        assert sum(merged) == 0, f"{name}: merged with GRADFLOW_POOL_MERGE=0: {merged}"
    ok(name)
    if R == 0:
        print(f"  merged collectives per step: {[int(m) for m in merged]}", flush=True)
    return merged


total = 0
total += sum(case("fp32 tiny buckets"))
total += sum(case("fp16 wire", compression=hvd.Compression.fp16, tol=2e-3))
total += sum(case("unused on one rank, model.zero_grad()", branch_rank=N - 1,
                  model_zero_grad=True))
total += sum(case("backward_passes_per_step=2", bpps=2))
# CSC: step 0 runs on the copy path, steps 1..WARMUP-1 are dense pool steps
# (mergeable; with the residual in the pool, P moves to G), checked against
# numpy; steps from WARMUP on are sparse: per bucket,
# never merged; their values are CSC's (tests/parallel/torch_csc_script.py
# checks them against its numpy model), here only identical on every rank.
WARMUP = int(_native.config()["sparse_warmup_steps"])
csc = case("csc warm-up then sparse", steps=WARMUP + 3, sparse_ratio=0.5, dense_steps=WARMUP)
assert all(m == 0 for m in csc[WARMUP:]), f"sparse CSC steps were merged: {csc}"
total += sum(csc)
if R == 0:
    print(f"merged collectives: {int(total)} (size {N})", flush=True)
    # Buckets cut over the whole script (GRADFLOW_POOL_FIRST_BUCKET_BYTES
    # changes the layout; the test compares two runs).
    print(f"pool buckets: {int(hvd.stats().get('pool.buckets', 0))} (size {N})", flush=True)
