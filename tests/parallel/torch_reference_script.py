# torch_reference_script.py — SPMD: DistributedOptimizer against a
# single-process simulation of every rank (rank 0 recomputes each rank's
# gradient on its own batch and averages them, missing gradients as zeros, as
# Horovod does) where plain "same batch, one process" cannot express the
# case: parameters unused on some ranks (both paths, every zero_grad
# flavour), autocast + GradScaler with an overflow on one rank, and training
# after broadcast_optimizer_state. Parameters must also be bitwise identical.
import copy

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import Branchy, assert_close, assert_identical, batch, digits, flat, mlp, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 12


def simulate_ranks(model, loss_of_rank, size=N):
    """Set p.grad to the average over ranks of each rank's gradient; a
    parameter without a gradient on a rank contributes zeros there."""
    total = {}
    for r in range(size):
        model.zero_grad(set_to_none=True)
        loss_of_rank(r).backward()
        for p in model.parameters():
            if p.grad is not None:
                total[p] = total[p] + p.grad if p in total else p.grad.clone()
    for p in model.parameters():
        if p.requires_grad:
            p.grad = total[p] / size if p in total else torch.zeros_like(p)


# 1. Parameters unused on some ranks: `extra` is used by every rank on step 0,
# then by one rank per step; `never` by no rank. Pool and copy paths, with
# model.zero_grad() (set_to_none=True: the pool view is dropped),
# model.zero_grad(set_to_none=False) and the optimizer's zero_grad().
def branchy_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    return F.cross_entropy(model(xb, step == 0 or r == step % N), yb)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


STEPS = 6
for use_pool in (True, False):
    for flavour in ("model.zero_grad()", "model.zero_grad(set_to_none=False)", "opt.zero_grad()"):
        m = Branchy()
        opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), use_pool=use_pool)
        for step in range(STEPS):
            if flavour == "opt.zero_grad()":
                opt.zero_grad()
            else:
                m.zero_grad(set_to_none=flavour == "model.zero_grad()")
            branchy_loss(m, step, R).backward()
            opt.step()
        name = f"unused parameters, pool={use_pool}, {flavour}"
        assert_identical(m.parameters(), name)
        if R == 0:
            ref = Branchy()
            ref_opt = sgd(ref.parameters())
            for step in range(STEPS):
                simulate_ranks(ref, lambda r: branchy_loss(ref, step, r))
                ref_opt.step()
            assert_close(flat(m.parameters()), flat(ref.parameters()), name, 1e-5)
        ok(name)


# 2. autocast(bfloat16) + GradScaler, rank 1 overflows on step 2: every rank
# skips that step, and the result matches the simulation of the same thing.
def amp_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(xb), yb)
    return loss * float("inf") if (step == 2 and r == 1) else loss


def amp_step(model, opt, scaler, backward, synchronize=None):
    backward()
    if synchronize:
        synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    if synchronize:
        with opt.skip_synchronize():
            scaler.step(opt)
    else:
        scaler.step(opt)
    scaler.update()


for use_pool in (True, False):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), use_pool=use_pool)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    for step in range(6):
        opt.zero_grad()
        amp_step(m, opt, scaler, lambda: scaler.scale(amp_loss(m, step, R)).backward(),
                 opt.synchronize)
    name = f"autocast + GradScaler, pool={use_pool}"
    assert_identical(m.parameters(), name)
    if R == 0:
        ref = mlp()
        ref_opt, ref_scaler = sgd(ref.parameters()), torch.amp.GradScaler("cpu", init_scale=1024.0,
                                                                         growth_interval=2)
        for step in range(6):
            amp_step(ref, ref_opt, ref_scaler, lambda: simulate_ranks(
                ref, lambda r: ref_scaler.scale(amp_loss(ref, step, r))))
        assert ref_scaler.get_scale() == scaler.get_scale(), (ref_scaler.get_scale(),
                                                               scaler.get_scale())
        assert_close(flat(m.parameters()), flat(ref.parameters()), name, 1e-5)
    ok(name)


# 3. broadcast_parameters + broadcast_optimizer_state, then training: every
# rank continues exactly as rank 0's model and Adam state would alone.
def plain_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    return F.cross_entropy(model(xb), yb)


m = mlp(seed=R)  # different weights, learning rates and Adam moments per rank
o = torch.optim.Adam(m.parameters(), lr=0.01 * (R + 1))
for step in range(2 + R):
    o.zero_grad()
    plain_loss(m, 100 + step, R).backward()
    o.step()
snapshot = (copy.deepcopy(m), copy.deepcopy(o.state_dict())) if R == 0 else None
hvd.broadcast_parameters(m.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(o, root_rank=0)
opt = hvd.DistributedOptimizer(o, m.named_parameters())
for step in range(4):
    opt.zero_grad()
    plain_loss(m, step, R).backward()
    opt.step()
assert_identical(m.parameters(), "after broadcast_optimizer_state")
if R == 0:
    ref, state = snapshot
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.5)
    ref_opt.load_state_dict(state)
    assert ref_opt.param_groups[0]["lr"] == 0.01
    for step in range(4):
        simulate_ranks(ref, lambda r: plain_loss(ref, step, r))
        ref_opt.step()
    assert_close(flat(m.parameters()), flat(ref.parameters()), "broadcast_optimizer_state", 1e-5)
ok("broadcast_optimizer_state, then training")
