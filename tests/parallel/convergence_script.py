"""Trains an MLP on scikit-learn's digits (real data, bundled) with
gradflow.torch on every rank and prints the final test accuracy and loss
curve. The communication mode comes from argv: dense | fp16 | bf16 |
csc0.1 | csc0.01 (CSC settings via GRADFLOW_SPARSE_* set by the caller); a
trailing "+amp" (e.g. csc0.01+amp) trains under autocast(float16) with a
GradScaler whose high initial scale overflows at first (skipped steps).
Shared by tests/parallel/test_convergence.py and benchmarks/convergence_bench.py."""
import json
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import gradflow.torch as hvd

# MODE[+fl][+amp]: +fl makes every Linear a FusedLinear (weight gradients
# accumulated in place into the pool views), +amp adds autocast + GradScaler.
mode, amp = sys.argv[1].split("+")[0], sys.argv[1].endswith("+amp")
fused = "+fl" in sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 30
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
torch.manual_seed(0)
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()

X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
# Each rank takes its shard; the global batch is the same for every size.
global_batch = 64
local_batch = global_batch // N
Xtr, ytr = torch.from_numpy(Xtr), torch.from_numpy(ytr)
Xte, yte = torch.from_numpy(Xte), torch.from_numpy(yte)

model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                            torch.nn.ReLU(), torch.nn.Linear(128, 10))
if fused:
    hvd.fuse_linear_grad_accumulation(model)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
kwargs = {}
if mode in ("fp16", "bf16"):
    kwargs["compression"] = getattr(hvd.Compression, mode)
if mode.startswith("csc"):
    kwargs["sparse_ratio"] = float(mode[3:])
# With momentum correction (GRADFLOW_SPARSE_MOMENTUM, Deep Gradient
# Compression) the momentum lives in the sparse residual, not the optimizer.
import os  # noqa: E402
momentum = 0.0 if float(os.environ.get("GRADFLOW_SPARSE_MOMENTUM", "0")) > 0 else 0.9
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=50, enabled=amp)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                               named_parameters=model.named_parameters(), grad_scaler=scaler,
                               **kwargs)
loss_fn = torch.nn.CrossEntropyLoss()
steps_per_epoch = len(Xtr) // global_batch
curve = []
g = torch.Generator().manual_seed(1)
skipped = 0
for epoch in range(epochs):
    perm = torch.randperm(len(Xtr), generator=g)  # same on every rank
    total = 0.0
    for s in range(steps_per_epoch):
        idx = perm[s * global_batch:(s + 1) * global_batch][R * local_batch:(R + 1) * local_batch]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            loss = loss_fn(model(Xtr[idx]), ytr[idx])
        scaler.scale(loss).backward()
        opt.synchronize()  # reduce first: every rank's scaler sees the same overflow
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scale = scaler.get_scale() if amp else 1.0
        scaler.update()
        skipped += amp and scaler.get_scale() < scale  # backoff: this step overflowed
        total += loss.item()
    curve.append(hvd.allreduce(torch.tensor(total / steps_per_epoch), name="epoch_loss").item())
with torch.no_grad():
    acc = (model(Xte).argmax(1) == yte).float().mean().item()
stats = hvd.stats() if hasattr(hvd, "stats") else {}
if R == 0:
    print("RESULT " + json.dumps({"mode": sys.argv[1], "ranks": N, "accuracy": acc,
                                  "loss_curve": curve, "skipped_steps": int(skipped),
                                  "loss_scale": scaler.get_scale() if amp else None,
                                  "bytes_sent": stats.get("bytes_sent", 0),
                                  "chunks_sent": stats.get("sparse.chunks_sent", 0),
                                  "chunks_total": stats.get("sparse.chunks_total", 0)}))
