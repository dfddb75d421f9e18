# torch_compress_groups_script.py — Horovod's custom Compressor interface and
# DistributedOptimizer(groups=/num_groups=) on gradflow.torch, against
# single-process references: a user compressor runs around every allreduce
# (its effect, a rounding to a 1/8 grid, shows in the numbers), grouped
# gradients go out together, and all ranks end bitwise identical.
import warnings

import numpy as np
import torch

import gradflow.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.manual_seed(0)


class Grid8(hvd.Compressor):
    """Rounds to multiples of 1/8 in float64 for the wire; back to the dtype."""

    @staticmethod
    def compress(tensor):
        return torch.round(tensor.double() * 8), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return (tensor / 8).to(ctx)


def grid8_np(a):
    return np.round(np.asarray(a, np.float64) * 8)


def same_everywhere(t, what):
    raw = torch.from_numpy(np.frombuffer(t.detach().numpy().tobytes(), np.uint8).copy())
    everyone = hvd.allgather(raw[None, :], name=f"bytes.{what}")
    assert all(torch.equal(row, everyone[0]) for row in everyone), f"{what}: ranks differ"


def x_of(r):
    return (torch.arange(6, dtype=torch.float32) * 0.37 - 1.1) * (r + 1) + 0.05 * r


STACK = np.stack([x_of(r).numpy() for r in range(N)])

# ---- collectives with a user compressor: compress, reduce, decompress
want_sum = (grid8_np(STACK).sum(0) / 8).astype(np.float32)
got = hvd.allreduce(x_of(R), op=hvd.Sum, compression=Grid8)
assert got.dtype == torch.float32 and np.allclose(got.numpy(), want_sum, rtol=0, atol=1e-6), got
assert not np.allclose(want_sum, STACK.sum(0), atol=1e-3)  # the compressor did change the numbers
same_everywhere(got, "allreduce")
inplace = x_of(R)
hvd.allreduce_(inplace, op=hvd.Sum, compression=Grid8)
assert torch.equal(inplace, got), (inplace, got)
h = hvd.allreduce_async(x_of(R), op=hvd.Sum, compression=Grid8)
assert torch.equal(hvd.synchronize(h), got)
outs = hvd.grouped_allreduce([x_of(R), 2 * x_of(R)], op=hvd.Sum, compression=Grid8)
assert torch.equal(outs[0], got)
assert np.allclose(outs[1].numpy(), grid8_np(2 * STACK).sum(0) / 8, rtol=0, atol=1e-6)
# An instance with compress/decompress methods works as well as a class.
got_inst = hvd.allreduce(x_of(R), op=hvd.Sum, compression=Grid8())
assert torch.equal(got_inst, got)
print(f"ok compressor collectives (size {N})", flush=True)

# ---- Horovod's Compression used directly casts, as in Horovod
half, ctx = hvd.Compression.fp16.compress(x_of(R))
assert half.dtype == torch.float16 and ctx == torch.float32
back = hvd.Compression.fp16.decompress(half, ctx)
assert back.dtype == torch.float32 and torch.equal(back, x_of(R).half().float())
ints, ctx = hvd.Compression.fp16.compress(torch.arange(3))
assert ints.dtype == torch.int64  # only floating tensors are cast
same, ctx = hvd.Compression.none.compress(x_of(R))
assert same is not None and hvd.Compression.none.decompress(same, ctx) is same
# Given to gradflow, fp16 is the 16-bit wire: float32 in, float32 out, and
# values exact in fp16 whose sums are exact come back exact.
exact = torch.tensor([0.5, -1.25, 3.0, 64.0]) * (R + 1)
wired = hvd.allreduce(exact, op=hvd.Sum, compression=hvd.Compression.fp16)
assert wired.dtype == torch.float32
assert torch.equal(wired, torch.tensor([0.5, -1.25, 3.0, 64.0]) * (N * (N + 1) // 2))
try:
    hvd.allreduce(x_of(R), compression="fp16")
except TypeError as e:
    assert "compress" in str(e), e
else:
    raise AssertionError("a string compression was accepted")
print(f"ok compression objects (size {N})", flush=True)

# ---- DistributedOptimizer: reference = every rank's gradient computed here
LR, STEPS = 0.1, 3


def make_model():
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    m.register_parameter("unused", torch.nn.Parameter(torch.ones(2)))  # never gets a gradient
    return m


def batch(r, step):
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)


def loss_of(m, x, y):
    return ((m(x) - y) ** 2).mean()


def reference(transform):
    """SGD on the average over ranks of transform(each rank's gradient)."""
    m = make_model()
    for step in range(STEPS):
        grads = []
        for r in range(N):
            m.zero_grad()
            loss_of(m, *batch(r, step)).backward()
            grads.append([np.zeros(p.shape) if p.grad is None else p.grad.double().numpy()
                          for p in m.parameters()])
        with torch.no_grad():
            for i, p in enumerate(m.parameters()):
                avg = transform(np.stack([g[i] for g in grads])).mean(0)
                p -= LR * torch.from_numpy(avg).float()
    return m


def train(what, **kwargs):
    m = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), m.named_parameters(),
                                   **kwargs)
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(m, *batch(R, step)).backward()
        if "groups" in kwargs or "num_groups" in kwargs or "compression" in kwargs:
            assert not opt._gradflow.use_pool, f"{what}: must use the copy path"
        opt.step()
    for i, p in enumerate(m.parameters()):
        same_everywhere(p, f"{what}.{i}")
    return m


def close(m, ref, what, atol):
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=atol), f"rank {R}: {what} {n}: {p} vs {q}"


ref_plain = reference(lambda g: g)
ref_grid = reference(lambda g: np.round(g * 8) / 8)
close(train("grid8", compression=Grid8), ref_grid, "compressor", 1e-6)
for what, kw in [("groups=2", {"groups": 2}), ("groups=5", {"groups": 5}),
                 ("grid8+groups=1", {"groups": 1, "compression": Grid8})]:
    close(train(what, **kw), ref_grid if "compression" in kw else ref_plain, what, 1e-6)

# groups as lists of the model's own parameters; `unused` never gets a
# gradient, so its group goes out only when backward returns (with zeros,
# Note [Reduced when backward returns]), as in Horovod's step(). Checked
# from hooks that run after the optimizer's, while backward runs.
model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                               model.named_parameters(),
                               groups=[[model[0].weight, model[0].bias],
                                       [model.unused, model[2].bias]])
seen = {}


def check_groups(_p):
    s = opt._gradflow
    w, b = s.handles.get(id(model[0].weight)), s.handles.get(id(model[0].bias))
    if w is not None and b is not None:  # the group is complete: it went out as one
        seen["together"] = w is b
        seen["early"] = id(model[2].bias) in s.handles


for p in (model[0].weight, model[0].bias):
    p.register_post_accumulate_grad_hook(check_groups)
for step in range(STEPS):
    opt.zero_grad()
    seen.clear()
    loss_of(model, *batch(R, step)).backward()
    assert not opt._gradflow.use_pool, "groups use the copy path"
    assert seen.get("together") is True, f"group not sent together: {seen}"
    assert seen["early"] is False, "a group went out before all its gradients"
    opt.step()
close(model, ref_plain, "groups list", 1e-6)
for i, p in enumerate(model.parameters()):
    same_everywhere(p, f"list.{i}")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = train("num_groups", num_groups=2)
assert any(issubclass(w.category, DeprecationWarning) and "num_groups" in str(w.message)
           for w in caught), [str(w.message) for w in caught]
close(m, ref_plain, "num_groups", 1e-6)
print(f"ok optimizer (size {N})", flush=True)

# ---- bad groups: ValueError on every rank, before any communication
m = make_model()
for bad, text in [(0, "positive integer"), (-2, "positive integer"), (True, "positive integer"),
                  ([[m[0].weight, m[0].weight]], "only appear once"), ([["w"]], "torch.Tensor")]:
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), groups=bad)
    except ValueError as e:
        assert text in str(e), e
    else:
        raise AssertionError(f"groups={bad!r} accepted")
print(f"ok errors (size {N})", flush=True)
hvd.shutdown()
print(f"ok done (size {N})", flush=True)
