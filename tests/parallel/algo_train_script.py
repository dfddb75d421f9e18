# algo_train_script.py — SPMD: DistributedOptimizer training (SGD, several
# steps: step 1 on the copy path, then pool buckets) with the allreduce
# algorithm GRADFLOW_ALLREDUCE_ALGO, against single-process training on rank 0
# whose gradients are combined the way the algorithm documents it.
"""With two-sync (and mpi on the 16-bit wire) each element's reduction is
layout-independent: fp32 sum of the ranks' (16-bit rounded) gradients in rank
order, one rounding on the 16-bit wire, times float32(1/N). So the reference
is exact and the comparison is bitwise, for pool and copy paths, several
buckets, fp32/fp16/bf16 wire; stats must show the algorithm ran.
recursive-doubling is layout-independent too, with its own order of
additions (tests/parallel/_rd_model.py): the reference follows it."""
import os

import torch

import gradflow.torch as hvd
from _rd_model import recursive_doubling
from _torch_common import assert_identical, combined_reference, digits, flat, mlp, ok, train

ALGO = os.environ["GRADFLOW_ALLREDUCE_ALGO"]
hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER_RANK, STEPS = 16, 5
DT16 = {"fp16": torch.float16, "bf16": torch.bfloat16}
COMP = {"fp32": hvd.Compression.fp32, "fp16": hvd.Compression.fp16, "bf16": hvd.Compression.bf16}


def combine(grads, wire):
    """The documented average of per-rank gradients (see the docstring)."""
    q = (lambda t: t.to(DT16[wire]).to(torch.float32)) if wire in DT16 else (lambda t: t)
    if ALGO == "recursive-doubling":
        return recursive_doubling(grads, q) * torch.tensor(1.0 / N, dtype=torch.float32)
    acc = q(grads[0]).clone()
    for g in grads[1:]:
        acc = acc + q(g)
    return q(acc) * torch.tensor(1.0 / N, dtype=torch.float32)


def reference(wire):
    """Single-process training: rank r's gradient is computed from rank r's batch."""
    return combined_reference(lambda grads: combine(grads, wire), STEPS, N, PER_RANK, X, Y)


def case(wire, use_pool):
    name = f"{ALGO} {wire} {'pool' if use_pool else 'copy'}"
    model = mlp()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=COMP[wire], use_pool=use_pool, bucket_mb=0.004)
    hvd.reset_stats()
    train(model, opt, STEPS, R, N, PER_RANK, x=X, y=Y)
    st = hvd.stats()
    ran = {k: v for k, v in st.items() if k.startswith("allreduce.count.")}
    assert ran.get(f"allreduce.count.{ALGO}.{wire}", 0) >= STEPS and \
        sum(ran.values()) == ran[f"allreduce.count.{ALGO}.{wire}"], (name, ran)
    assert_identical(model.parameters(), name)
    if R == 0:
        ref = reference(wire)
        a, b = flat(model.parameters()), flat(ref.parameters())
        # mpi on fp32 is MPI_Allreduce: the library's summation order.
        tol = 1e-6 if (ALGO == "mpi" and wire == "fp32") else 0.0
        err = (a - b).abs().max().item()
        assert err <= tol, f"{name}: parameters differ from single-process training by {err}"
    ok(name)


for wire in ("fp16", "bf16") if ALGO == "mpi" else ("fp32", "fp16", "bf16"):
    for use_pool in (True, False):
        case(wire, use_pool)
