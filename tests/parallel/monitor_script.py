"""Run by test_launcher_monitor.py under `gradflowrun --monitor 1`: a small
torch linear regression trained with gradflow.torch.DistributedOptimizer for
a few seconds (STEPS steps, a short sleep each, like a real step's compute),
checked against a numpy reference of the same averaged-gradient SGD; every
rank's weights must be bitwise identical. Rank 0 prints one RESULT line
(steps, seconds, bytes sent) for the test to compare the monitor's line with."""
import json
import sys
import time

import numpy as np
import torch

import gradflow
import gradflow.torch as gt

STEPS, SLEEP, LR, DIM = 160, 0.025, 0.02, 1024


def data(rank):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((32, DIM)).astype(np.float32)
    return x, (x @ np.linspace(-1, 1, DIM, dtype=np.float32)).astype(np.float32)


gradflow.init()
rank, size = gradflow.rank(), gradflow.size()
model = torch.nn.Linear(DIM, 1, bias=False)
torch.nn.init.zeros_(model.weight)
opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                              named_parameters=model.named_parameters())
x, y = (torch.from_numpy(a) for a in data(rank))
start = time.perf_counter()
for _ in range(STEPS):
    opt.zero_grad()
    loss = ((model(x).squeeze(1) - y) ** 2).mean()
    loss.backward()
    time.sleep(SLEEP)
    opt.step()
elapsed = time.perf_counter() - start
sent = gradflow.stats().get("bytes_sent", 0.0)  # training's allreduces only

# numpy reference: the same SGD on the average of every rank's gradient.
w = np.zeros(DIM, dtype=np.float64)
for _ in range(STEPS):
    g = np.zeros(DIM)
    for r in range(size):
        xr, yr = (a.astype(np.float64) for a in data(r))
        g += 2.0 * xr.T @ (xr @ w - yr) / len(yr)
    w -= LR * g / size
got = model.weight.detach().numpy()[0]
assert np.allclose(got, w, rtol=1e-4, atol=1e-5), np.abs(got - w).max()
every = gt.allgather(model.weight.detach().reshape(1, -1)).numpy()
assert all(np.array_equal(every[0], every[r]) for r in range(size)), "ranks differ"
if rank == 0:
    print("RESULT " + json.dumps({"steps": STEPS, "seconds": elapsed,
                                  "bytes_sent": sent}))
sys.stdout.flush()
