# _torch_common.py — shared pieces of the torch SPMD test scripts: models,
# deterministic data (every rank can rebuild every rank's batch, so rank 0
# computes a single-process reference with plain torch) and cross-rank checks.
"""Helpers for tests/parallel/torch_*_script.py (run under mpiexec)."""
from __future__ import annotations

import hashlib
import os
import sys
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

import gradflow.torch as hvd

torch.set_num_threads(1)

if os.environ.get("GRADFLOW_TEST_FUSED_LINEAR") == "1":
    # Every torch.nn.Linear the scripts build (distributed models and plain
    # torch references alike) takes FusedLinear's weight-gradient path.
    from gradflow.torch.fused_linear import FusedLinear
    torch.nn.Linear = FusedLinear


def digits():
    """sklearn digits as float tensors (N, 64) and labels (N,)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    return x, y


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


class SmallCNN(torch.nn.Module):
    """8x8 digits -> conv -> relu -> linear (several dtypes-free shapes)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x.view(-1, 1, 8, 8))).flatten(1))


class Branchy(torch.nn.Module):
    """Linear 64 -> 10 plus a second head `extra` added only when the caller
    says so (unused on some ranks or steps) and a Linear `never` no forward
    uses: the unused-parameter cases of the optimizer tests."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(64, 10)
        self.extra = torch.nn.Linear(64, 10)
        self.never = torch.nn.Linear(3, 3)

    def forward(self, x, use_extra: bool):
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def batch(x, y, step: int, rank: int, size: int, per_rank: int):
    """Rank `rank`'s shard of global batch `step` (deterministic)."""
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randperm(x.shape[0], generator=g)[: per_rank * size]
    mine = idx[rank * per_rank:(rank + 1) * per_rank]
    return x[mine], y[mine]


def global_batch(x, y, step: int, size: int, per_rank: int):
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randperm(x.shape[0], generator=g)[: per_rank * size]
    return x[idx], y[idx]


def train(model, opt, steps: int, rank: int, size: int, per_rank: int, bpps: int = 1,
          start: int = 0, x=None, y=None):
    """Plain training loop used both distributed (rank's shard) and as the
    single-process reference (rank 0 of size 1 with the global batch)."""
    if x is None:
        x, y = digits()
    for step in range(start, start + steps):
        opt.zero_grad()
        for p in range(bpps):
            xb, yb = batch(x, y, step * bpps + p, rank, size, per_rank)
            F.cross_entropy(model(xb), yb).backward()
        opt.step()


def combined_reference(combine: Callable, steps: int, size: int, per_rank: int, x, y):
    """Single-process reference of SGD(lr=0.1, momentum=0.9) training on
    mlp(): each step computes every rank's gradient from that rank's batch
    and applies combine(per-rank gradients of one parameter), the reduction
    the distributed run documents for its algorithm and wire."""
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        grads = []  # grads[r][i]: rank r's gradient of parameter i
        for r in range(size):
            ref.zero_grad()
            xb, yb = batch(x, y, step, r, size, per_rank)
            F.cross_entropy(ref(xb), yb).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for i, p in enumerate(ref.parameters()):
            p.grad = combine([g[i] for g in grads])
        opt.step()
    return ref


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in params])


def digest(t: torch.Tensor) -> np.ndarray:
    """SHA-256 of the tensor's bytes (a CUDA tensor is copied to the host)."""
    h = hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).digest()
    return np.frombuffer(h, np.uint8).copy()


def assert_identical(params, what: str) -> None:
    """Parameters bitwise identical on every rank (allgather of a hash: every
    rank sees every rank's hash, so all raise alike). CPU or CUDA tensors."""
    mine = digest(torch.cat([p.detach().reshape(-1).float().cpu() for p in params]))
    every = hvd.allgather_object(mine.tobytes())
    assert all(e == every[0] for e in every), f"{what}: parameters differ between ranks"


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    err = (a - b).abs().max().item()
    scale = max(1.0, b.abs().max().item())
    assert err <= tol * scale, f"{what}: max abs difference {err} (tolerance {tol * scale})"


def expect_error(fn: Callable, *needles: str, exc: type = hvd.GradflowError) -> str:
    """Run fn; it must raise `exc` whose message contains every needle."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"error message lacks {n!r}: {msg}"
        return msg
    raise AssertionError(f"expected {exc.__name__} containing {needles}")


def ok(name: str) -> None:
    if hvd.rank() == 0:
        sys.stdout.write(f"ok {name} (size {hvd.size()})\n")  # one write: other ranks print too
        sys.stdout.flush()

