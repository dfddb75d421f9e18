# sparse_policy_script.py — SPMD: GRADFLOW_SPARSE_POLICY=auto (Note [Auto
# sparse policy], native/sparse_auto_policy.cc). Each rank gets its own
# fixed cost schedule (GRADFLOW_SPARSE_AUTO_COSTS) whose local preference
# disagrees with the ranks' summed costs on some steps: every rank must
# follow the sums. Checked against a numpy model of CSC with error feedback
# in which a dense step sends residual + gradient of every chunk, on the
# in-pool residual path (fp32 and fp16 wire), on the classic path with
# GradScaler and an overflow step, and with measured costs (no schedule):
# bitwise identical on every rank and sent + residual == sum of gradients.
# Run with GRADFLOW_SPARSE_POLICY=auto GRADFLOW_SPARSE_CHUNK=64
# GRADFLOW_SPARSE_WARMUP_STEPS=0; argv[1] = "fixed" or "measured".
import os
import sys

from mpi4py import MPI

MODE = sys.argv[1]
RANK0 = MPI.COMM_WORLD.Get_rank()
# Policy step s uses pair s mod 4. Summed over N >= 2 ranks the decisions
# are sparse, dense, dense, sparse: on step 1 rank 0 alone prefers sparse,
# on step 2 every rank but 0 does.
SCHEDULE = {0: "1,2;1,2;8,1;1,2", "other": "1,2;3,1;1,2;1,2"}
DECISIONS = ["sparse", "dense", "dense", "sparse"]
if MODE == "fixed":
    os.environ["GRADFLOW_SPARSE_AUTO_COSTS"] = SCHEDULE[0] if RANK0 == 0 else SCHEDULE["other"]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gradflow  # noqa: E402
import gradflow.torch as hvd  # noqa: E402
from gradflow import _native  # noqa: E402
from _torch_common import assert_close, assert_identical, batch, digits, flat, mlp, ok  # noqa: E402
from _csc_policy_model import CscModel, layout, pack, pool_residual, rank_grads, set_grads  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER, LR, CHUNK = 16, 0.1, 64
cfg = _native.config()
assert cfg["sparse_policy"] == "auto" and cfg["sparse_chunk"] == CHUNK
assert cfg["sparse_warmup_steps"] == 0


def plain_loss(model, step, r):
    xb, yb = batch(X, Y, step, r, N, PER)
    return F.cross_entropy(model(xb), yb)


def decision(s):
    return DECISIONS[s % 4] == "dense"


def train(opt_kwargs, steps, lr, loss_fn=plain_loss, scaler=None):
    """Distributed training; returns (model, opt, per-step reduced gradients
    in pool order from step 1 on, stats delta)."""
    gradflow.reset_stats()
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=lr), m.named_parameters(),
                                   **opt_kwargs)
    reduced, order = [], None
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(m, step, R)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
        if step == 0:
            order, _ = layout(opt, CHUNK)
        else:
            reduced.append(pack([p.grad for p in order]))
    return m, opt, order, reduced, gradflow.stats()


def reference(order_names, bounds, ratio, steps, lr, sampled, decisions, loss_fn=plain_loss,
              scale_of=None):
    """Single-process numpy CSC model with the same decisions."""
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref_order = [dict(ref.named_parameters())[n] for n in order_names]
    csc = CscModel(bounds, ratio, sampled, CHUNK, N)
    outs = []
    for step in range(steps):
        S = scale_of(step) if scale_of else 1.0
        grads = [g / np.float32(S) for g in
                 rank_grads(ref, ref_order, step, lambda mm, st, r: loss_fn(mm, st, r) * S, N)]
        if step == 0:
            out, overflow = np.mean(grads, 0, dtype=np.float32), False
        else:
            out, overflow = csc.step(grads, dense=decisions(step - 1))
        if not overflow:
            set_grads(ref_order, out)
            ref_opt.step()
        if step > 0:
            outs.append(out)
    return ref, csc, outs


def names_of(m, order):
    return [k for p in order for k, q in m.named_parameters() if q is p]


def check_conservation(m, opt, order, reduced, steps, what):
    """lr = 0: every step's gradients are fixed, so what was sent (N x the
    averaged result, steps 1..) plus every rank's residual left in the pool
    must equal the sum over ranks and steps of the gradients."""
    ref = mlp()
    ref_order = [dict(ref.named_parameters())[n] for n in names_of(m, order)]
    total = np.zeros_like(reduced[0], dtype=np.float64)
    for step in range(1, steps):
        for g in rank_grads(ref, ref_order, step, plain_loss, N):
            total += g
    sent = np.sum(np.array(reduced, np.float64), 0) * N
    kept = np.sum(hvd.allgather_object(pool_residual(opt, order).astype(np.float64)), 0)
    err = np.abs(sent + kept - total).max()
    assert err <= 1e-4 * max(1.0, np.abs(total).max()), f"{what}: sent + residual != sum ({err})"


if MODE == "fixed":
    STEPS = 10
    ndense = sum(decision(s) for s in range(STEPS - 1))
    # 1. In-pool residual, several buckets, fp32 and fp16 wire.
    for compression, tol in ((None, 1e-5), ("fp16", 2e-3)):
        kw = dict(sparse_ratio=0.1, bucket_mb=0.004)
        if compression:
            kw["compression"] = hvd.Compression.fp16
        m, opt, order, reduced, st = train(kw, STEPS, LR)
        order_, bounds = layout(opt, CHUNK)
        assert len(bounds) > 1 and opt._gradflow.pools[0].out is not None
        assert st.get("sparse.buckets_sent_dense_by_policy", 0) == ndense * len(bounds), st
        assert st.get("sparse.in_pool_steps", 0) == (STEPS - 1 - ndense) * len(bounds), st
        assert_identical(m.parameters(), f"auto policy, pool, {compression}")
        if R == 0:
            ref, _, _ = reference(names_of(m, order), bounds, 0.1, STEPS, LR, True, decision)
            assert_close(flat(m.parameters()), flat(ref.parameters()), f"auto {compression}", tol)
        ok(f"auto policy in pool ({compression or 'fp32'} wire): decisions follow the summed costs")
        del opt

    # 2. Conservation with lr = 0: sent + residual == sum of gradients.
    m, opt, order, reduced, st = train(dict(sparse_ratio=0.1, bucket_mb=0.004), STEPS, 0.0)
    check_conservation(m, opt, order, reduced, STEPS, "auto, fixed costs")
    if R == 0:
        _, bounds = layout(opt, CHUNK)
        _, _, outs = reference(names_of(m, order), bounds, 0.1, STEPS, 0.0, True, decision)
        for s, (a, b) in enumerate(zip(reduced, outs)):
            assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max()), f"step {s + 1}"
    ok("auto policy: sent + residual == sum of gradients, per-step results match the model")
    del opt

    # 3. Classic residual (grad_scaler=) + autocast bf16; rank 1 overflows on
    # step 3 (a dense-decision step): nothing sent, residual kept.
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    scales = []

    def amp_loss(model, step, r):
        xb, yb = batch(X, Y, step, r, N, PER)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(xb), yb)
        return loss * float("inf") if (step == 3 and r == 1) else loss

    def amp_loss_recording(model, step, r):
        if r == R:
            scales.append(scaler.get_scale())
        return amp_loss(model, step, r)

    m, opt, order, reduced, st = train(dict(sparse_ratio=0.1, grad_scaler=scaler), STEPS, LR,
                                       amp_loss_recording, scaler)
    assert opt._gradflow.pools[0].out is None, "grad_scaler= keeps the classic residual"
    assert st.get("sparse.overflow_steps", 0) == 1, st
    assert_identical(m.parameters(), "auto policy, classic residual, GradScaler")
    if R == 0:
        _, bounds = layout(opt, CHUNK)
        ref, _, _ = reference(names_of(m, order), bounds, 0.1, STEPS, LR, False, decision, amp_loss,
                              scale_of=lambda step: scales[step])
        assert_close(flat(m.parameters()), flat(ref.parameters()), "auto amp", 1e-5)
    ok("auto policy + GradScaler overflow on a dense-decision step: residual kept")
    del opt
else:
    # Measured costs: whatever is decided, every rank decides the same and
    # nothing is lost or counted twice.
    STEPS = 14
    m, opt, order, reduced, st = train(dict(sparse_ratio=0.05, bucket_mb=0.004), STEPS, 0.0)
    got = [np.frombuffer(x.tobytes(), np.uint8) for x in reduced]
    every = hvd.allgather_object([bytes(g) for g in got])
    assert all(e == every[0] for e in every), "reduced gradients differ between ranks"
    check_conservation(m, opt, order, reduced, STEPS, "auto, measured costs")
    dense = st.get("sparse.buckets_sent_dense_by_policy", 0)
    ok(f"auto policy, measured costs: identical on every rank, conserved "
       f"({int(dense)} dense bucket sends of {int(dense + st.get('sparse.in_pool_steps', 0))})")
