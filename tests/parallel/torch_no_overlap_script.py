# torch_no_overlap_script.py — SPMD: DistributedOptimizer(overlap=False), the
# ablation's "no overlap" step (benchmarks/ablation.py). Checks that nothing
# is submitted before step() (the option does what it says), that training
# gives parameters bitwise equal to the default overlap=True path (same pool
# layout, buckets and wire) and to each other on every rank, that they match
# single-process training on the concatenated batch, and that a bad value
# raises on every rank.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import (SmallCNN, assert_close, assert_identical, batch, digits, flat, mlp, ok,
                           train)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER_RANK = 16
STEPS = 5


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def trained(make_model, overlap, bpps=1, **kw):
    model = make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps, overlap=overlap, **kw)
    train(model, opt, STEPS, R, N, PER_RANK, bpps, x=X, y=Y)
    return model


def case(name, make_model, bpps=1, check_ref=True, tol=1e-5, **kw):
    base = trained(make_model, True, bpps, **kw)
    off = trained(make_model, False, bpps, **kw)
    assert_identical(off.parameters(), name)
    same = all(torch.equal(a, b) for a, b in zip(base.parameters(), off.parameters()))
    agreed = hvd.allgather_object(same)
    assert all(agreed), f"{name}: overlap=False differs from overlap=True on ranks " \
                        f"{[r for r, v in enumerate(agreed) if not v]}"
    if check_ref and R == 0:
        ref = make_model()
        train(ref, sgd(ref), STEPS, 0, 1, PER_RANK * N, bpps, x=X, y=Y)
        assert_close(flat(off.parameters()), flat(ref.parameters()), name, tol)
    ok(name)


# Nothing leaves during backward: when the last gradient's hook has run (a
# hook of ours registered after the optimizer's, on the parameter autograd
# reaches last) no handle exists and every gradient waits in backward order,
# the order synchronize() submits in. It runs when backward returns (Note
# [Reduced when backward returns]), so after backward nothing is deferred.
for use_pool in (True, False):
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   use_pool=use_pool, overlap=False)
    s = opt._gradflow
    backward_order = [id(p) for p in reversed(list(model.parameters()))]
    seen = []

    def at_last_hook(_p):
        seen.append((bool(s.handles or s.pool_handles), [id(q) for q in s.deferred]))

    model[0].weight.register_post_accumulate_grad_hook(at_last_hook)
    for step in range(3):  # step 1 is the copy path, later steps the pool (if any)
        opt.zero_grad()
        xb, yb = batch(X, Y, step, R, N, PER_RANK)
        F.cross_entropy(model(xb), yb).backward()
        submitted, deferred = seen[-1]
        assert not submitted, f"step {step}: submitted during backward"
        assert deferred == backward_order, \
            f"step {step}: deferred {len(deferred)} gradients, not in backward order"
        assert not s.deferred, f"step {step}: not submitted when backward returned"
        opt.step()
    assert len(seen) == 3
    assert_identical(model.parameters(), f"deferred, use_pool={use_pool}")
ok("overlap=False submits nothing during backward")

case("pool mlp", mlp)
case("pool cnn, tiny buckets", SmallCNN, bucket_mb=0.004)
case("pool mlp fp16 wire", mlp, compression=hvd.Compression.fp16, tol=2e-4)
case("pool mlp sparse ratio 0.5", mlp, sparse_ratio=0.5, check_ref=False)
case("pool cnn, 2 passes per step", SmallCNN, bpps=2)
case("copy cnn (fusion off)", SmallCNN, use_pool=False)

try:
    hvd.DistributedOptimizer(sgd(mlp()), overlap="no")
    raise AssertionError("overlap='no' was accepted")
except ValueError as e:
    assert "overlap" in str(e), e
ok("bad overlap value raises")
