"""shutdown() + init() with an optimizer of the previous runtime still alive:
its hooks must raise a clear error instead of marking ranges in the new
runtime's pools, and its finalizer must not destroy the new runtime's pool.
The new optimizer trains exactly like single-process SGD on the average
gradient (compared with a reference computed here)."""
import gc

import numpy as np
import torch

import gradflow as gf
import gradflow.torch as hvd

torch.set_default_dtype(torch.float64)
LR = 0.1


def batch(rank, step):
    g = np.random.RandomState(1000 * step + rank)
    return torch.from_numpy(g.randn(8, 4)), torch.from_numpy(g.randn(8, 1))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def train(model, opt, steps, rank):
    for s in steps:
        x, y = batch(rank, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def reference(steps, n):
    """Plain SGD on the mean of every rank's loss = the average gradient."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for s in steps:
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y)
                   for x, y in (batch(r, s) for r in range(n))) / n
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


gf.init()
R, N = gf.rank(), gf.size()
old_model = make_model()
old_opt = hvd.DistributedOptimizer(torch.optim.SGD(old_model.parameters(), lr=LR),
                                   named_parameters=old_model.named_parameters())
train(old_model, old_opt, range(3), R)  # step >= 2 uses the pool
gf.shutdown()
gf.init()

model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                               named_parameters=model.named_parameters())
train(model, opt, range(2), R)  # the new runtime's pool now exists

# The old optimizer's hooks fire: a clear error, nothing marked in the new pool.
x, y = batch(R, 99)
try:
    torch.nn.functional.mse_loss(old_model(x), y).backward()
except Exception as e:  # raised by the hook, re-raised by autograd
    assert "shut down" in str(e), e
else:
    raise AssertionError("a hook of an optimizer from before shutdown() did not raise")
del old_opt, old_model  # its finalizer runs: it must not destroy the new pool
gc.collect()

train(model, opt, range(2, 5), R)
for got, want in zip(model.parameters(), reference(range(5), N)):
    torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)
if R == 0:
    print(f"reinit optimizer OK on {N} ranks", flush=True)
