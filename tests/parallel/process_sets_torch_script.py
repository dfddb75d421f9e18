"""torch DistributedOptimizer(process_set=...) on 2-4 ranks, run by
test_process_sets.py: the even and the odd ranks each train their own model
on their own data at the same time, in their own process set. Within a set
every member ends bitwise identical; with the dense wire the parameters
equal single-process training on the set's concatenated batches (computed by
each member with plain torch). argv[1]: "pool" (gradient pool, the default),
"copy" (use_pool=False), "fp16" (16-bit wire), "csc" (sparse_ratio=0.5 over
the pool, run with small GRADFLOW_SPARSE_CHUNK; members identical, the
set's engine sent only some chunks).
Prints "torch <variant> OK on N ranks" from rank 0.
"""
import hashlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close, batch, digits, global_batch, mlp

VARIANT = sys.argv[1]
STEPS, PER_RANK = 6, 16
hvd.init()
R, N = hvd.rank(), hvd.size()
even = hvd.add_process_set([r for r in range(N) if r % 2 == 0])
odd = hvd.add_process_set([r for r in range(N) if r % 2 == 1])
ps = even if R % 2 == 0 else odd
m, k = ps.size(), ps.rank()
x, y = digits()
offset = 100 * ps.process_set_id  # each set trains on other batches, with another model


def run(model, opt, rank, size):
    for step in range(STEPS):
        opt.zero_grad()
        xb, yb = batch(x, y, offset + step, rank, size, PER_RANK)
        F.cross_entropy(model(xb), yb).backward()
        opt.step()


model = mlp(seed=ps.process_set_id)
kw = {"pool": {}, "copy": {"use_pool": False}, "fp16": {"compression": hvd.Compression.fp16},
      "csc": {"sparse_ratio": 0.5}}[VARIANT]
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5),
                               named_parameters=model.named_parameters(), process_set=ps, **kw)
run(model, opt, k, m)
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

# Bitwise identical within the set (digests allgathered in the set only).
d = np.frombuffer(hashlib.sha256(mine.numpy().tobytes()).digest(), np.uint8).copy()
every = hvd.allgather(torch.from_numpy(d).reshape(1, -1), process_set=ps)
assert bool((every == every[0]).all()), f"rank {R}: parameters differ within {ps}"

# Single-process reference on the set's concatenated batches (plain torch).
ref = mlp(seed=ps.process_set_id)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.5)
for step in range(STEPS):
    ref_opt.zero_grad()
    xb, yb = global_batch(x, y, offset + step, m, PER_RANK)
    F.cross_entropy(ref(xb), yb).backward()
    ref_opt.step()
want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
if VARIANT in ("pool", "copy"):
    assert_close(mine, want, f"rank {R} {VARIANT}", tol=1e-5)
elif VARIANT == "fp16":
    assert_close(mine, want, f"rank {R} fp16", tol=2e-2)
elif m == 1:  # csc on a one-rank set: nothing to exchange, plain torch (Note [One rank])
    assert hvd.stats(process_set=ps).get("sparse.chunks_total", 0) == 0, (R, hvd.stats(process_set=ps))
    assert torch.equal(mine, want), f"rank {R}: one-rank csc differs from plain torch"
else:  # csc: sparse chunks went through this set's engine, not the global one
    stats = hvd.stats(process_set=ps)
    assert 0 < stats.get("sparse.chunks_sent", 0) < stats.get("sparse.chunks_total", 0), (R, stats)
    assert hvd.stats().get("sparse.chunks_sent", 0) == 0, (R, hvd.stats())
    assert torch.isfinite(mine).all(), R
    diff = (mine - want).abs().max().item()
    assert diff > 0, (R, diff, stats)  # sparse steps really differ from dense
# The two sets' models differ (each trained its own), the global set still works.
other = hvd.allgather(mine.reshape(1, -1)[:, :8])
assert not torch.equal(other[0], other[1]) or N == 1
assert int(hvd.allreduce(torch.tensor([1]), op=hvd.Sum)) == N
if R == 0:
    print(f"torch {VARIANT} OK on {N} ranks", flush=True)
hvd.shutdown()
