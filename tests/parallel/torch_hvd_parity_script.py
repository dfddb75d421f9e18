# torch_hvd_parity_script.py — SPMD: Horovod 0.28 parity of gradflow.torch
# (issue 14): set_backward_passes_per_step, broadcast_optimizer_state(model=),
# grouped_allgather / grouped_reducescatter and reducescatter's pre/postscale,
# each against numpy / single-process references; bad input raises everywhere.
import numpy as np
import torch

import gradflow.torch as hvd
from _torch_common import (assert_close, assert_identical, digits, expect_error, flat, mlp, ok,
                           train)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 12


def rank_data(r, shape, seed=0):
    """Deterministic per-rank float64 data, computable on every rank."""
    return np.random.default_rng(seed * 100 + r).standard_normal(shape)


def rows_of(n, dim0):
    return [dim0 // n + (1 if p < dim0 % n else 0) for p in range(n)]


def my_block(full, r=R):
    rows = rows_of(N, full.shape[0])
    start = sum(rows[:r])
    return full[start:start + rows[r]]


# 1. set_backward_passes_per_step(2) trains like backward_passes_per_step=2
for use_pool in (True, False):
    a, b = mlp(), mlp()
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    oa = hvd.DistributedOptimizer(sgd(a), a.named_parameters(), backward_passes_per_step=2,
                                  use_pool=use_pool)
    ob = hvd.DistributedOptimizer(sgd(b), b.named_parameters(), use_pool=use_pool)
    assert ob.backward_passes_per_step == 1
    ob.set_backward_passes_per_step(2)
    assert ob.backward_passes_per_step == 2
    train(a, oa, 3, R, N, PER, bpps=2, x=X, y=Y)
    train(b, ob, 3, R, N, PER, bpps=2, x=X, y=Y)
    # (not bitwise: on the copy path the core's fusion depends on timing, and
    # a different fusion layout changes the ring's summation order)
    d = float((flat(a.parameters()) - flat(b.parameters())).abs().max())
    assert d < 1e-6, f"set_backward_passes_per_step differs from the constructor's: {d}"
    assert_identical(b.parameters(), "set_backward_passes_per_step")
    if R == 0:  # and both equal single-process training on the global batch
        ref = mlp()
        train(ref, sgd(ref), 3, 0, 1, PER * N, 2, x=X, y=Y)
        assert_close(flat(b.parameters()), flat(ref.parameters()), "set_bpps vs reference")
    # change mid-training back to 1: the next steps train as bpps=1
    ob.set_backward_passes_per_step(1)
    train(b, ob, 2, R, N, PER, bpps=1, start=6, x=X, y=Y)
    assert_identical(b.parameters(), "set_backward_passes_per_step back to 1")
    # in the middle of an accumulation it raises (on every rank: all call it alike)
    ob.set_backward_passes_per_step(2)
    ob.zero_grad()
    torch.nn.functional.cross_entropy(b(X[:PER]), Y[:PER]).backward()
    expect_error(lambda: ob.set_backward_passes_per_step(3), "middle of a step")
    torch.nn.functional.cross_entropy(b(X[:PER]), Y[:PER]).backward()
    ob.step()
    for bad in (0, -1, 1.5, True):
        expect_error(lambda: ob.set_backward_passes_per_step(bad), ">= 1", exc=ValueError)
    ok(f"set_backward_passes_per_step pool={use_pool}")


# 2. broadcast_optimizer_state(opt, root_rank, model=): root's state everywhere
for root in {0, N - 1}:
    torch.manual_seed(R)  # different weights and states per rank
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=False), torch.nn.Flatten(),
                            torch.nn.Linear(8, 3))
    opt = torch.optim.Adam(m.parameters(), lr=0.01 * (R + 1))
    if R % 2 == 0:  # odd ranks keep an empty state
        m(torch.tensor([[1, 2]])).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root, model=m)
    # root's state after the call: an empty one was initialised first by one
    # local step on zero gradients, as Horovod does (torch_optimizer_init_script.py)
    ref = hvd.broadcast_object(opt.state_dict(), root_rank=root)
    assert all(int(s["step"]) == 1 for s in ref["state"].values()) and ref["state"]
    got = opt.state_dict()
    assert got["param_groups"][0]["lr"] == ref["param_groups"][0]["lr"]
    assert set(got["state"]) == set(ref["state"])
    for k, st in ref["state"].items():
        for name, v in st.items():
            assert torch.equal(torch.as_tensor(got["state"][k][name]), torch.as_tensor(v)), name
    hvd.broadcast_optimizer_state(opt, root_rank=root, model=None)  # keyword spelling
    expect_error(lambda: hvd.broadcast_optimizer_state(opt, root, model="net"), "nn.Module",
                 exc=TypeError)
ok("broadcast_optimizer_state model=")


# 3. grouped_allgather of ragged tensors (dim 0 differs per rank and per tensor)
def ragged(r):
    return [torch.from_numpy(rank_data(r, (r + 1, 3), 1)).float(),
            torch.from_numpy(rank_data(r, (2 * r + 2,), 2)),
            torch.arange(3 - (r % 3), dtype=torch.int32).reshape(-1, 1) + r]


outs = hvd.grouped_allgather(ragged(R), name="ga")
h = hvd.grouped_allgather_async(ragged(R))
outs_async = hvd.synchronize(h)
assert isinstance(outs, list) and isinstance(outs_async, list) and len(outs) == 3
for i in range(3):
    expect = torch.cat([ragged(r)[i] for r in range(N)])
    assert outs[i].dtype == expect.dtype and torch.equal(outs[i], expect), i
    assert torch.equal(outs_async[i], expect), i
# gradient: each rank's rows of the averaged incoming gradient (as allgather)
xs = [torch.ones(R + 1, 2, requires_grad=True), torch.ones(2, requires_grad=True)]
ys = hvd.grouped_allgather(xs, name="ga.grad")
(sum((y * (k + 1) * (torch.arange(y.shape[0]).reshape(-1, *[1] * (y.dim() - 1)) + 1)).sum()
     for k, y in enumerate(ys))).backward()
off = sum(range(1, R + 1))
assert torch.equal(xs[0].grad, (torch.arange(off, off + R + 1).float() + 1).reshape(-1, 1)
                   .expand(R + 1, 2))
assert torch.equal(xs[1].grad, 2 * (torch.arange(2 * R, 2 * R + 2).float() + 1))
expect_error(lambda: hvd.grouped_allgather(torch.ones(2)), "list or tuple", exc=TypeError)
ok("grouped_allgather ragged")


# 4. grouped_reducescatter with Sum and Average (dim 0 not divisible by N too)
shapes = [(2 * N + 1, 3), (N,), (5, 2, 2)]
for op, name in ((hvd.Sum, "Sum"), (hvd.Average, "Average")):
    ins = [torch.from_numpy(rank_data(R, s, 10 + i)) for i, s in enumerate(shapes)]
    outs = hvd.grouped_reducescatter(ins, name=f"grs.{name}", op=op)
    outs_async = hvd.synchronize(hvd.grouped_reducescatter_async(ins, op=op))
    assert isinstance(outs, list) and len(outs) == 3
    for i, s in enumerate(shapes):
        full = sum(rank_data(r, s, 10 + i) for r in range(N))
        if op == hvd.Average:
            full = full / N
        expect = my_block(full)
        np.testing.assert_allclose(outs[i].numpy(), expect, rtol=1e-12, atol=1e-12)
        assert torch.equal(outs[i], outs_async[i])
    ok(f"grouped_reducescatter {name}")
# default op is Average, as Horovod
d = hvd.grouped_reducescatter([torch.full((N, 2), float(R + 1))])[0]
assert torch.allclose(d, torch.full((1, 2), (N + 1) / 2.0, dtype=torch.float32))
# gradient: allgather of the incoming gradient, / N for Average
x = torch.ones(2 * N, requires_grad=True)
hvd.grouped_reducescatter([x], name="grs.grad", op=hvd.Average)[0].sum().backward()
assert torch.allclose(x.grad, torch.full((2 * N,), 1.0 / N))
expect_error(lambda: hvd.grouped_reducescatter([torch.ones(2)], process_set=object()),
             "process_set", exc=ValueError)


# 5. reducescatter with prescale / postscale (sync, async, Sum, Average, Max)
for op, name in ((hvd.Sum, "Sum"), (hvd.Average, "Average"), (hvd.Max, "Max")):
    s = (2 * N + 1, 4)
    t = torch.from_numpy(rank_data(R, s, 20))
    pre, post = -0.5, 3.0  # negative prescale: Max of scaled inputs != scaled Max
    scaled = [-0.5 * rank_data(r, s, 20) for r in range(N)]
    full = {"Sum": sum(scaled), "Average": sum(scaled) / N,
            "Max": np.max(np.stack(scaled), axis=0)}[name] * post
    expect = my_block(full)
    before = t.clone()
    got = hvd.reducescatter(t, name=f"rs.{name}", op=op, prescale_factor=pre,
                            postscale_factor=post)
    got_async = hvd.synchronize(hvd.reducescatter_async(t, op=op, prescale_factor=pre,
                                                        postscale_factor=post))
    np.testing.assert_allclose(got.numpy(), expect, rtol=1e-12, atol=1e-12)
    assert torch.equal(got, got_async)
    assert torch.equal(t, before), "prescale must not modify the input"
    # the grouped form scales alike
    g = hvd.grouped_reducescatter([t], op=op, prescale_factor=pre, postscale_factor=post)[0]
    assert torch.equal(g, got)
    ok(f"reducescatter prescale/postscale {name}")
# float32 with prescale (the 32-bit kernel path) and the gradient's scaling
t32 = torch.from_numpy(rank_data(R, (N, 3), 21)).float()
got = hvd.reducescatter(t32, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
full = sum(rank_data(r, (N, 3), 21).astype(np.float32) for r in range(N)) * 0.5
np.testing.assert_allclose(got.numpy(), my_block(full), rtol=1e-5, atol=1e-6)
x = torch.ones(N, requires_grad=True)
hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0).sum().backward()
assert torch.allclose(x.grad, torch.full((N,), 6.0))
expect_error(lambda: hvd.reducescatter(torch.ones(N), process_set=object()), "process_set",
             exc=ValueError)
ok("reducescatter scaling float32 + gradient")

# step() after synchronize() outside skip_synchronize(): one warning in
# Horovod's words (Horovod's test_synchronize_step_warning matches on them)
import warnings  # noqa: E402

m = torch.nn.Linear(1, 1)
hvd.broadcast_parameters(m.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               named_parameters=m.named_parameters())
opt.zero_grad()
torch.nn.functional.mse_loss(m(torch.zeros(1, 1) + R), torch.ones(1, 1)).backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    opt.step()
assert len(ws) == 1 and "optimizer.step() called without optimizer.skip_synchronize()" \
    in str(ws[0].message), [str(w.message) for w in ws]
assert_identical(m.parameters(), "step after synchronize")
ok("step() after synchronize() warns in Horovod's words")

# broadcast_parameters with model.parameters(), as Horovod documents it (a
# list of bare tensors, a generator, a list mixing (name, tensor) pairs and
# tensors). Before 2026-11-28 each bare tensor was unpacked as a (name,
# value) pair of its own rows: RuntimeError "Boolean value of Tensor with
# more than one value is ambiguous" on every rank.
for form in ("list", "generator", "mixed"):
    torch.manual_seed(R)  # different on every rank
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    torch.manual_seed(0)
    root = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    if R == 0:
        m.load_state_dict(root.state_dict())
    params = {"list": list(m.parameters()), "generator": m.parameters(),
              "mixed": [("first.weight", m[0].weight), m[0].bias] + list(m[1].parameters())}[form]
    hvd.broadcast_parameters(params, root_rank=0)
    for got, want in zip(m.parameters(), root.parameters()):
        assert torch.equal(got, want), form
    assert_identical(m.parameters(), f"broadcast_parameters({form} of parameters)")
expect_error(lambda: hvd.broadcast_parameters(torch.ones(2), root_rank=0), "invalid params",
             exc=ValueError)
ok("broadcast_parameters of model.parameters() (list, generator, mixed with names)")
