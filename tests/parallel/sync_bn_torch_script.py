# sync_bn_torch_script.py — SPMD: gradflow.torch.SyncBatchNorm against a
# single-process torch.nn.BatchNorm*d on the concatenated global batch (every
# rank rebuilds every rank's data): forward output, running stats, input /
# weight / bias gradients, for equal, unequal and empty local batches, fp32
# and fp64; eval mode; convert_sync_batchnorm; training with
# DistributedOptimizer against single-process training; errors on every rank;
# process_set= (3+ ranks: two disjoint sets, each its own global batch);
# join() with ranks running out of data at different steps.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close as _assert_close
from _torch_common import assert_identical, digits, expect_error, flat, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}


def assert_close(a, b, what, tol):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if b.numel():  # a rank with an empty local batch has nothing to compare
        _assert_close(a, b, what, tol)


def layouts():
    """Per-rank local batch sizes: equal, unequal, and one rank empty."""
    yield "equal", [4] * N
    yield "unequal", [2 + 3 * r for r in range(N)]
    if N > 1:
        yield "empty rank", [3 + r for r in range(N - 1)] + [0]


def bounds(sizes, r=R):
    start = sum(sizes[:r])
    return start, start + sizes[r]


def allreduce_sum(t):
    return hvd.allreduce(t.detach(), op=hvd.Sum, name=None)


def same_on_every_rank(t, what):
    every = hvd.allgather(t.detach().reshape(1, -1))
    assert all(torch.equal(every[0], e) for e in every), f"{what} differs between ranks"


def check_layer(shape_tail, ref_cls, dtype, sizes, momentum=0.1, affine=True, track=True,
                steps=2):
    """`steps` training forwards/backwards of a fresh SyncBatchNorm against
    ref_cls on the global batch; then one eval forward."""
    C = shape_tail[0]
    total = sum(sizes)
    lo, hi = bounds(sizes)
    ref = ref_cls(C, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    bn = hvd.SyncBatchNorm(C, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    gen = torch.Generator().manual_seed(7)
    if affine:
        with torch.no_grad():
            w = torch.rand(C, generator=gen, dtype=dtype) + 0.5
            b = torch.randn(C, generator=gen, dtype=dtype)
            ref.weight.copy_(w), ref.bias.copy_(b), bn.weight.copy_(w), bn.bias.copy_(b)
    what = f"{ref_cls.__name__}{shape_tail} {dtype} sizes={sizes} m={momentum} affine={affine}"
    for step in range(steps):
        # offset and scale make E[x^2]-E[x]^2 shortcuts visibly inaccurate in fp32
        X = (torch.randn(total, *shape_tail, generator=gen, dtype=dtype) * 3 + 10).requires_grad_()
        G = torch.randn(total, *shape_tail, generator=gen, dtype=dtype)
        ref.zero_grad(), bn.zero_grad()
        out_ref = ref(X)
        (out_ref * G).sum().backward()
        x = X.detach()[lo:hi].clone().requires_grad_()
        out = bn(x)
        (out * G[lo:hi]).sum().backward()
        tol = TOL[dtype]
        assert out.dtype == dtype and out.shape == x.shape
        assert_close(out.detach(), out_ref.detach()[lo:hi], f"{what} step {step} output", tol)
        assert_close(x.grad, X.grad[lo:hi], f"{what} step {step} input grad", tol)
        if affine:  # local shares; their sum is the single-process gradient
            assert_close(allreduce_sum(bn.weight.grad), ref.weight.grad, f"{what} weight grad",
                         tol)
            assert_close(allreduce_sum(bn.bias.grad), ref.bias.grad, f"{what} bias grad", tol)
        if track:
            assert_close(bn.running_mean, ref.running_mean, f"{what} running_mean", tol)
            assert_close(bn.running_var, ref.running_var, f"{what} running_var", tol)
            same_on_every_rank(torch.cat([bn.running_mean, bn.running_var]), "running stats")
            assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
    bn.eval(), ref.eval()
    X = torch.randn(total, *shape_tail, generator=gen, dtype=dtype) * 2 + 1
    # eval with running stats needs no peer: one rank alone may run it
    if track and R == N - 1:
        assert_close(bn(X[lo:hi]).detach(), ref(X).detach()[lo:hi], f"{what} eval", TOL[dtype])
    elif not track:  # no running stats: eval normalizes with global batch stats
        assert_close(bn(X[lo:hi]).detach(), ref(X).detach()[lo:hi], f"{what} eval", TOL[dtype])
    hvd.barrier()


# 1. forward, running stats and gradients vs BatchNorm1d/2d on the global batch
for dtype in (torch.float32, torch.float64):
    for name, sizes in layouts():
        check_layer((5,), torch.nn.BatchNorm1d, dtype, sizes)
        check_layer((3, 4, 2), torch.nn.BatchNorm2d, dtype, sizes)
    ok(f"matches single-process BatchNorm {dtype}")

# 2. variants: cumulative average (momentum None), no affine, no running stats, 3d input
sizes = [2 + r for r in range(N)]
check_layer((4, 3), torch.nn.BatchNorm1d, torch.float64, sizes, momentum=None, steps=3)
check_layer((4,), torch.nn.BatchNorm1d, torch.float32, sizes, affine=False)
check_layer((3, 2, 2), torch.nn.BatchNorm2d, torch.float64, sizes, track=False)
check_layer((2, 2, 2, 2), torch.nn.BatchNorm3d, torch.float64, sizes)
ok("momentum None, affine False, no running stats, 3d")

# 3. convert_sync_batchnorm keeps parameters, buffers and flags
src = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6, momentum=0.3),
                          torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2)))
src[1].running_mean.fill_(0.5)
src[2][1].eval()
src[2][1].weight.requires_grad_(False)
conv = hvd.SyncBatchNorm.convert_sync_batchnorm(src)
assert isinstance(conv[1], hvd.SyncBatchNorm) and isinstance(conv[2][1], hvd.SyncBatchNorm)
assert isinstance(conv[0], torch.nn.Linear) and conv[1].momentum == 0.3
assert conv[1].weight is src[1].weight and torch.equal(conv[1].running_mean, torch.full((6,), 0.5))
assert not conv[2][1].training and not conv[2][1].weight.requires_grad
assert hvd.SyncBatchNorm.convert_sync_batchnorm(conv)[1] is conv[1]  # already converted
ok("convert_sync_batchnorm")


# 4. training with DistributedOptimizer == single-process training on the global
# batch with loss = mean over ranks of each rank's mean loss (what averaging
# the ranks' gradients optimizes); unequal local batches
def net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.BatchNorm1d(24),
                               torch.nn.ReLU(), torch.nn.Linear(24, 10))


X, Y = digits()
sizes = [6 + 3 * r for r in range(N)]
lo, hi = bounds(sizes)
model = hvd.SyncBatchNorm.convert_sync_batchnorm(net())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               model.named_parameters())
ref = net()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for step in range(4):
    idx = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(step))[:sum(sizes)]
    xb, yb = X[idx], Y[idx]
    opt.zero_grad()
    F.cross_entropy(model(xb[lo:hi]), yb[lo:hi]).backward()
    opt.step()
    ref_opt.zero_grad()
    out = ref(xb)
    loss = sum(F.cross_entropy(out[a:b], yb[a:b]) for a, b in (bounds(sizes, r) for r in range(N)))
    (loss / N).backward()
    ref_opt.step()
    assert_identical(list(model.parameters()) + list(model.buffers())[:2], f"step {step}")
    assert_close(flat(model.parameters()), flat(ref.parameters()), f"training step {step}", 1e-5)
assert_close(model[1].running_var, ref[1].running_var, "trained running_var", 1e-5)
model.eval(), ref.eval()
assert_close(model(X[:50]).detach(), ref(X[:50]).detach(), "eval after training", 1e-5)
ok("DistributedOptimizer training matches single process")

# 4b. join(): rank r has 2 + r steps of data, then joins (Note [SyncBatchNorm
# under join]). A joined rank counts as an empty local batch, so each step
# equals single-process training on the active ranks' batches (gradients
# averaged over all N ranks, as DistributedOptimizer does under join). Before:
# the training ranks' forward raised (allgather refused while a rank has
# joined), the joined ranks' join() returned as if nothing had happened.
model = hvd.SyncBatchNorm.convert_sync_batchnorm(net())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               model.named_parameters())
ref = net()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for step in range(N + 1):
    idx = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(50 + step))[:sum(sizes)]
    xb, yb = X[idx], Y[idx]
    active = [r for r in range(N) if step < 2 + r]
    if R in active:
        opt.zero_grad()
        F.cross_entropy(model(xb[lo:hi]), yb[lo:hi]).backward()
        opt.step()
    rows = torch.cat([torch.arange(*bounds(sizes, r)) for r in active])
    ref_opt.zero_grad()
    out, at = ref(xb[rows]), 0
    loss = 0
    for r in active:
        a, b = bounds(sizes, r)
        loss = loss + F.cross_entropy(out[at:at + b - a], yb[a:b])
        at += b - a
    (loss / N).backward()
    ref_opt.step()
    if step == 1 + R:
        assert hvd.join() == N - 1
hvd.broadcast_parameters(model.state_dict(), root_rank=N - 1)
assert_identical(list(model.parameters()) + list(model.buffers())[:2], "join")
assert_close(flat(model.parameters()), flat(ref.parameters()), "training under join", 1e-5)
assert_close(model[1].running_mean, ref[1].running_mean, "running_mean under join", 1e-5)
ok("join(): a joined rank is an empty local batch")

# 5. errors: bad input raises on every rank (all ranks call alike), no hang
bn = hvd.SyncBatchNorm(3)
expect_error(lambda: bn(torch.ones(3)), "at least 2D", exc=ValueError)
expect_error(lambda: bn(torch.ones(4, 2)), "expected 3 channels", exc=ValueError)
# one value per channel in the *global* batch: every rank sees the gathered counts
tiny = torch.randn(1 if R == 0 else 0, 3)
if N > 1:
    expect_error(lambda: bn(tiny), "more than 1 value per channel", exc=ValueError)
    bn(torch.randn(1, 3))  # one row per rank is enough globally: no error
hvd.barrier()
ok("errors on every rank")


# 6. process_set=: the global batch is the set's. Two disjoint sets (3 ranks:
# {0, 2} and the one-rank {1}; 4 ranks: {0, 2} and {1, 3}) train their own
# model on data of different scales, each equal to single-process training on
# its set's batch; a layer only one set has does not wait for the other set.
# Before: every SyncBatchNorm pooled all ranks' statistics (silently mixing
# the sets), or waited on the ranks without the layer until they shut down.
if N >= 3:
    sets = [[r for r in range(N) if r % 2 == 0], [r for r in range(N) if r % 2 == 1]]
    handles = [hvd.add_process_set(ranks) for ranks in sets]
    mine_ranks = sets[R % 2]
    mine = handles[R % 2]
    other = handles[1 - R % 2]
    M, me = len(mine_ranks), mine_ranks.index(R)
    sizes = [5 + 2 * r for r in mine_ranks]  # this set's local batch sizes, in set order
    lo, hi = bounds(sizes, me)
    shift = 0.0 if R % 2 == 0 else 50.0  # the sets' data differ: pooled statistics would show

    # a layer of this set against BatchNorm on the set's batch (forward, grads, running stats)
    gen = torch.Generator().manual_seed(11 + R % 2)
    X = (torch.randn(sum(sizes), 4, 3, generator=gen, dtype=torch.float64) * 2 + shift)
    G = torch.randn(sum(sizes), 4, 3, generator=gen, dtype=torch.float64)
    ref = torch.nn.BatchNorm1d(4).double()
    bn = hvd.SyncBatchNorm(4, process_set=mine).double()
    Xr = X.clone().requires_grad_()
    (ref(Xr) * G).sum().backward()
    x = X[lo:hi].clone().requires_grad_()
    out = bn(x)
    (out * G[lo:hi]).sum().backward()
    what = f"process set {mine_ranks}"
    ref_out = torch.nn.functional.batch_norm(X, None, None, training=True)[lo:hi]
    assert_close(out.detach(), ref_out, f"{what} output", 1e-11)
    assert_close(x.grad, Xr.grad[lo:hi], f"{what} input grad", 1e-11)
    w_sum = hvd.allreduce(bn.weight.grad, op=hvd.Sum, process_set=mine)
    assert_close(w_sum, ref.weight.grad, f"{what} weight grad", 1e-11)
    assert_close(bn.running_mean, ref.running_mean, f"{what} running_mean", 1e-11)
    assert_close(bn.running_var, ref.running_var, f"{what} running_var", 1e-11)

    # only the even set's model has this layer; the odd set does not take part
    if R % 2 == 0:
        only = hvd.SyncBatchNorm(7, process_set=mine)
        only(torch.randn(3, 7)).sum().backward()
    else:  # a non-member in training mode raises before communicating ...
        foreign = hvd.SyncBatchNorm(7, process_set=other)
        expect_error(lambda: foreign(torch.randn(3, 7)), "not a member", exc=ValueError)
        assert int(foreign.num_batches_tracked) == 0  # nothing counted either
        foreign.eval()  # ... and in eval mode with running statistics needs no peer
        assert_close(foreign(torch.ones(2, 7)), torch.ones(2, 7) / (1 + 1e-5) ** 0.5,
                     "non-member eval", 1e-6)

    # training on each set: DistributedOptimizer and SyncBatchNorm over it
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(net(), process_set=mine)
    assert model[1].process_set is mine
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   model.named_parameters(), process_set=mine)
    ref = net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    Xd, Yd = digits()
    Xd = Xd + shift / 10
    for step in range(3):
        idx = torch.randperm(Xd.shape[0], generator=torch.Generator().manual_seed(step))
        xb, yb = Xd[idx[:sum(sizes)]], Y[idx[:sum(sizes)]]
        opt.zero_grad()
        F.cross_entropy(model(xb[lo:hi]), yb[lo:hi]).backward()
        opt.step()
        ref_opt.zero_grad()
        out = ref(xb)
        loss = sum(F.cross_entropy(out[a:b], yb[a:b])
                   for a, b in (bounds(sizes, k) for k in range(M)))
        (loss / M).backward()
        ref_opt.step()
        assert_close(flat(model.parameters()), flat(ref.parameters()), f"{what} step {step}", 1e-5)
    every = hvd.allgather(flat(list(model.parameters()) + list(model.buffers())[:2]).reshape(1, -1),
                          process_set=mine)
    assert all(torch.equal(every[0], e) for e in every), f"{what}: members differ"
    hvd.barrier()
    ok("process sets: per-set statistics, no waiting on other sets, per-set training")
