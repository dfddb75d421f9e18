# torch_param_kinds_script.py — SPMD: the torch DistributedOptimizer on
# parameters of unusual kinds, as DDP users have them: complex64 and
# complex128 parameters (one with lazily conjugated gradients), a weight tied
# between an embedding and the output layer, a non-contiguous parameter and a
# channels_last convolution; on the pool, copy, groups, CSC, fp16-wire and
# accumulation paths. Every rank must end bitwise identical and equal to plain
# torch averaging the ranks' gradients, and the pool's gradient views must
# keep the parameters' strides (no "gradient layout contract" warning from
# autograd). Complex parameters and optimizer state broadcast from root.
# Parameters on the meta device, op=Adasum on a complex parameter and
# wrapping a DistributedOptimizer again are refused at construction, on
# every rank. A model converted to channels_last after the pools exist.
import warnings

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close, assert_identical, expect_error, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
STEPS, B = 3, 4


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.emb = torch.nn.Embedding(10, 6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: one parameter, used twice
        self.wc = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.complex64) * 0.3)
        self.wd = torch.nn.Parameter(torch.randn(4, dtype=torch.complex128) * 0.3)
        self.t = torch.nn.Parameter(torch.randn(5, 6).t())  # strides (1, 6)

    def forward(self, img, tok):
        h = F.relu(self.conv(img)).mean((2, 3)).sum(1, keepdim=True)
        e = self.emb(tok).mean(1)
        z = e.to(torch.complex64) @ self.wc.conj()  # the gradient of wc comes lazily conjugated
        z = (z.to(torch.complex128) * self.wd).abs().sum(1, keepdim=True).float()
        return self.head(e + z + h) + (e @ self.t).sum(1, keepdim=True)


def make():
    return Net().to(memory_format=torch.channels_last)


def data(step: int, r: int):
    g = torch.Generator().manual_seed(1000 * step + r)
    img = torch.randn(B, 2, 4, 4, generator=g).contiguous(memory_format=torch.channels_last)
    return img, torch.randint(0, 10, (B, 3), generator=g), torch.randint(0, 10, (B,), generator=g)


def loss_of(model, step: int, r: int):
    img, tok, y = data(step, r)
    return F.cross_entropy(model(img, tok), y)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def reference(bpps: int, convert_at: int = -1):
    """Plain torch: each step averages every rank's gradient of its batch(es);
    the model goes channels_last before step `convert_at` (or from the start)."""
    ref = make() if convert_at < 0 else Net()
    opt = sgd(ref)
    for step in range(STEPS):
        if step == convert_at:
            ref.to(memory_format=torch.channels_last)
        total = None
        for r in range(N):
            ref.zero_grad()
            for k in range(bpps):
                loss_of(ref, step * bpps + k, r).backward()
            grads = [p.grad.clone() for p in ref.parameters()]
            total = grads if total is None else [a + g for a, g in zip(total, grads)]
        for p, g in zip(ref.parameters(), total):
            p.grad = g / N
        opt.step()
    return ref


PATHS = [("pool", {}, 1e-6), ("copy", {"use_pool": False}, 1e-6), ("groups", {"groups": 2}, 1e-6),
         ("csc", {"sparse_ratio": 0.5}, 1e-6),  # one chunk per bucket: everything is sent
         ("fp16 wire", {"compression": hvd.Compression.fp16}, 2e-3),
         ("accumulation", {"backward_passes_per_step": 2}, 1e-6)]
layout_warnings = []
for path, kw, tol in PATHS:
    bpps = kw.get("backward_passes_per_step", 1)
    model = make()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            opt.zero_grad()
            for k in range(bpps):
                loss_of(model, step * bpps + k, R).backward()
            opt.step()
    # autograd warns once per process: the pool path runs first
    layout_warnings += [str(w.message) for w in caught if "layout contract" in str(w.message)]
    assert not layout_warnings, f"{path}: {layout_warnings[0]}"
    if path == "pool":
        assert model.conv.weight.grad.stride() == model.conv.weight.stride()
        assert model.t.grad.stride() == model.t.stride() == (1, 6)
    assert model.wc.grad.dtype == torch.complex64 and model.wd.grad.dtype == torch.complex128
    assert_identical([torch.view_as_real(p.detach()) if p.is_complex() else p
                      for p in model.parameters()], f"{path}: parameter kinds")
    want = reference(bpps)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        got, exp = (torch.view_as_real(p.detach()), torch.view_as_real(q.detach())) \
            if p.is_complex() else (p.detach(), q.detach())
        assert_close(got.double(), exp.double(), f"{path}: {name}", tol)
    ok(f"complex, tied, non-contiguous and channels_last parameters: {path}")

# Note [Pool views replaced] (optimizer_state.py): a model converted to
# channels_last once the pools exist (after step 2). torch's conversion gives
# param.grad new storage: before, the pool reduced its stale bytes while each
# rank applied its own gradient (pool: ranks apart; CSC: identical but 0.13
# off plain torch). Now the pools are rebuilt for the new strides.
for path, kw, tol in PATHS[:1] + PATHS[3:4]:
    model = Net()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), **kw)
    for step in range(STEPS):
        if step == 2:
            model.to(memory_format=torch.channels_last)
        opt.zero_grad()
        loss_of(model, step, R).backward()
        opt.step()
    assert model.conv.weight.grad.stride() == model.conv.weight.stride()
    assert_identical([torch.view_as_real(p.detach()) if p.is_complex() else p
                      for p in model.parameters()], f"{path}: converted to channels_last")
    want = reference(1, convert_at=2)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        got, exp = (torch.view_as_real(p.detach()), torch.view_as_real(q.detach())) \
            if p.is_complex() else (p.detach(), q.detach())
        assert_close(got.double(), exp.double(), f"{path} converted: {name}", tol)
    ok(f"model.to(channels_last) once the pools exist: {path}")

# broadcast_parameters / broadcast_optimizer_state of complex parameters and
# state (SGD momentum buffers): every rank ends with root's values, bitwise.
# Before: TypeError "unsupported dtype complex64" on every rank.
model = make()
opt = sgd(model)
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(R)).to(p.dtype))
loss_of(model, 0, R).backward()
opt.step()  # momentum buffers, complex ones included, differ per rank
ROOT = N - 1
want = hvd.broadcast_object(([p.detach().clone() for p in model.parameters()],
                             [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]),
                            root_rank=ROOT)
hvd.broadcast_parameters(model.state_dict(), root_rank=ROOT)
hvd.broadcast_optimizer_state(opt, root_rank=ROOT)
for p, w, m in zip(model.parameters(), *want):
    assert torch.equal(p.detach(), w) and torch.equal(opt.state[p]["momentum_buffer"], m), p.shape
assert_identical([torch.view_as_real(t) if t.is_complex() else t for p in model.parameters()
                  for t in (p.detach(), opt.state[p]["momentum_buffer"])], "complex broadcasts")
ok("complex parameters and optimizer state broadcast from root")

# Refused at construction (every rank passes the same model, so all raise alike).
with torch.device("meta"):
    lazy = torch.nn.Linear(3, 3)
expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(lazy.parameters(), lr=0.1),
                                              named_parameters=lazy.named_parameters()),
             "'weight' is on the meta device", exc=ValueError)
if N & (N - 1) == 0:  # Adasum runs on power-of-two rank counts only
    cplx = torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD([cplx], lr=0.1), op=hvd.Adasum),
                 "op=Adasum of the complex parameter", exc=ValueError)
once = hvd.DistributedOptimizer(torch.optim.SGD(lazy.to_empty(device="cpu").parameters(), lr=0.1))
expect_error(lambda: hvd.DistributedOptimizer(once), "already a gradflow DistributedOptimizer",
             exc=ValueError)
hvd.barrier()
ok("meta-device parameters, Adasum of a complex one and wrapping twice are refused at construction")
