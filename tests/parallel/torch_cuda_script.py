# torch_cuda_script.py — SPMD: gradflow.torch with CUDA tensors, which the
# torch binding stages through host memory (ops.py `_staged`; the gradient
# pool is CPU-only, so CUDA parameters take the optimizer's copy path).
# Every collective against a closed form, results on the input's device;
# DistributedOptimizer training against plain torch on the full batch on the
# same device, bitwise equal across ranks, on the copy path, fp16 wire, CSC,
# groups, backward_passes_per_step=2 and fused Adam; AMP (autocast fp16 +
# GradScaler) with an overflow on one rank; SyncBatchNorm against BatchNorm
# on the full batch. GRADFLOW_TEST_DEVICE=cpu runs the same checks on CPU
# (how the script itself is checked on a machine without a GPU).
# Each section reports "ok <what> (size N)" or "FAIL <what>: <error>" and the
# script goes on, so one device run reports every section.
import os
import sys
import traceback
import warnings

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_identical, ok

DEV = torch.device(os.environ.get("GRADFLOW_TEST_DEVICE", "cuda"))
hvd.init()
R, N = hvd.rank(), hvd.size()
if DEV.type == "cuda":
    # One GPU per rank where there are enough, else the ranks share.
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    DEV = torch.device("cuda", torch.cuda.current_device())
# On CUDA, TF32 matmuls would make the reference differ beyond rounding.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
FAILED = []


def section(name):
    def run(fn):
        try:
            fn()
            ok(name)
        except Exception as e:  # report and go on: one device run, every section
            FAILED.append(name)
            print(f"FAIL {name} (rank {R}): {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        return fn
    return run


def val(rank, shape=(5, 3), dtype=torch.float32):
    return (torch.arange(torch.Size(shape).numel()).reshape(shape) % 7 + rank + 1).to(dtype)


def total(shape=(5, 3), dtype=torch.float32):
    return sum(val(r, shape, torch.float64) for r in range(N)).to(dtype)


def on_dev(t):
    assert t.device == DEV, f"result on {t.device}, input on {DEV}"
    return t.cpu()


@section("allreduce on the device")
def _():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        t = val(R, dtype=dtype).to(DEV)
        assert torch.equal(on_dev(hvd.allreduce(t, op=hvd.Sum)), total(dtype=dtype)), dtype
        assert torch.equal(t.cpu(), val(R, dtype=dtype)), "input modified"
    assert torch.allclose(on_dev(hvd.allreduce(val(R).to(DEV))), total() / N)
    t = val(R).to(DEV)
    assert hvd.allreduce_(t, op=hvd.Sum) is t and torch.equal(on_dev(t), total())
    t = val(R).to(DEV)
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="cuda.inplace.async")
    assert hvd.synchronize(h) is t and torch.equal(on_dev(t), total())
    h = hvd.allreduce_async(val(R).to(DEV), name="cuda.async", op=hvd.Sum,
                            prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(on_dev(hvd.synchronize(h)), total())
    nc = val(R, (3, 5)).to(DEV).t()
    hvd.allreduce_(nc, op=hvd.Sum)
    assert torch.equal(on_dev(nc), total((3, 5)).t())
    fp16 = hvd.allreduce(val(R).to(DEV), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert torch.equal(on_dev(fp16), total())
    assert torch.equal(on_dev(hvd.allreduce(val(R).to(DEV), op=hvd.Max)), val(N - 1))


@section("staging: CUDA tensors copied to host memory, CPU tensors used in place")
def _():
    from gradflow.torch.ops import _staged
    t = val(R).to(DEV)
    host = _staged(t)
    assert host.device.type == "cpu" and host.is_contiguous() and torch.equal(host, val(R))
    if DEV.type == "cuda":
        nc = _staged(t.t())  # non-contiguous on the device: a contiguous host copy
        assert nc.is_contiguous() and torch.equal(nc, val(R).t())
    else:
        assert host.data_ptr() == t.data_ptr(), "a contiguous CPU tensor is used in place"


@section("grouped allreduce on the device")
def _():
    ts = [val(R, (k + 1, 2)).to(DEV) for k in range(4)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
    assert all(torch.equal(on_dev(o), total((k + 1, 2))) for k, o in enumerate(outs))
    hvd.grouped_allreduce_(ts, op=hvd.Sum)
    assert all(torch.equal(on_dev(o), total((k + 1, 2))) for k, o in enumerate(ts))


@section("allgather, broadcast, alltoall, reducescatter on the device")
def _():
    S = N * (N + 1) // 2
    g = hvd.allgather(torch.full((R + 1, 2), float(R), dtype=torch.bfloat16, device=DEV))
    assert g.shape == (S, 2) and g.dtype == torch.bfloat16
    assert on_dev(g)[:, 0].tolist() == [float(r) for r in range(N) for _ in range(r + 1)]
    for root in range(N):
        t = val(R).to(DEV)
        assert torch.equal(on_dev(hvd.broadcast(t, root)), val(root))
        hvd.broadcast_(t, root)
        assert torch.equal(on_dev(t), val(root))
    x = torch.cat([torch.full((p + 1, 2), float(R)) for p in range(N)]).to(DEV)
    out, rsplits = hvd.alltoall(x, splits=torch.tensor([p + 1 for p in range(N)]))
    assert rsplits.tolist() == [R + 1] * N
    assert on_dev(out)[:, 0].tolist() == [float(s) for s in range(N) for _ in range(R + 1)]
    rs = hvd.reducescatter(val(R, (2 * N, 3)).to(DEV), op=hvd.Sum)
    assert torch.equal(on_dev(rs), total((2 * N, 3))[2 * R:2 * R + 2])


@section("autograd through allreduce and allgather on the device")
def _():
    x = val(R).to(DEV).requires_grad_()
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert x.grad.device == DEV and torch.equal(x.grad.cpu(), torch.full((5, 3), float(N)))
    y = torch.ones(2, 3, device=DEV, requires_grad=True)
    (hvd.allgather(y) * (R + 1)).sum().backward()
    # Horovod's allgather gradient: the average over ranks of the incoming one.
    assert torch.allclose(y.grad.cpu(), torch.full((2, 3), (N + 1) / 2))


# ------------------------------------------------------------------ training

STEPS, B = 6, 8  # B rows per rank per step


def batches(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(N * B, 64, generator=g)
    y = torch.randint(0, 10, (N * B,), generator=g)
    return x.to(DEV), y.to(DEV)


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10)).to(DEV)


def make_opt(kind, params):
    if kind == "fused_adam":
        return torch.optim.Adam(params, lr=1e-2, fused=True)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(kind, passes=1):
    """Plain torch on the full batch (every rank's rows), same device."""
    m = model()
    opt = make_opt(kind, m.parameters())
    # broadcast_optimizer_state's Horovod initialisation of an empty state:
    # one local step on zero gradients (Adam's step count is then 1).
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for step in range(STEPS):
        x, y = batches(step)
        opt.zero_grad()
        for p in range(passes):  # pass p: rows p of every rank's split
            rows = torch.cat([torch.arange(r * B, (r + 1) * B)[p::passes] for r in range(N)])
            F.cross_entropy(m(x[rows]), y[rows]).backward()
        opt.step()
    return [p.detach() for p in m.parameters()]


def distributed(kind, passes=1, **kw):
    m = model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = hvd.DistributedOptimizer(make_opt(kind, m.parameters()),
                                       named_parameters=m.named_parameters(),
                                       backward_passes_per_step=passes, **kw)
    if DEV.type == "cuda" and kw.get("use_pool", True):
        assert any("CPU-only" in str(w.message) for w in caught), [str(w.message) for w in caught]
    hvd.broadcast_parameters(m.state_dict(), 0)
    hvd.broadcast_optimizer_state(opt, 0)
    for step in range(STEPS):
        x, y = batches(step)
        opt.zero_grad()
        mine = torch.arange(R * B, (R + 1) * B)
        for p in range(passes):
            rows = mine[p::passes]
            F.cross_entropy(m(x[rows]), y[rows]).backward()
        opt.step()
    params = [p.detach() for p in m.parameters()]
    assert all(p.device == DEV for p in params)
    assert_identical(params, "DistributedOptimizer paths")
    return params


def close(got, want, tol):
    for g, w in zip(got, want):
        err = (g - w).abs().max().item()
        assert err <= tol, f"max |diff| {err} > {tol}"


for label, kind, passes, kw, tol in [
        ("copy path (default keywords)", "sgd", 1, {}, 1e-5),
        ("use_pool=False", "sgd", 1, {"use_pool": False}, 1e-5),
        ("fp16 wire", "sgd", 1, {"compression": hvd.Compression.fp16}, 5e-3),
        ("groups=2", "sgd", 1, {"groups": 2}, 1e-5),
        ("backward_passes_per_step=2", "sgd", 2, {}, 1e-5),
        ("fused Adam", "fused_adam", 1, {}, 1e-5)]:
    section(f"DistributedOptimizer {label} on the device matches plain torch")(
        lambda kind=kind, passes=passes, kw=kw, tol=tol:
            close(distributed(kind, passes, **kw), reference(kind, passes), tol))


@section("DistributedOptimizer CSC (sparse_ratio=0.25) on the device trains")
def _():
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(), sparse_ratio=0.25)
    hvd.broadcast_parameters(m.state_dict(), 0)
    x, y = batches(0)
    mine = slice(R * B, (R + 1) * B)
    first = None
    for step in range(40):  # one batch, many steps: the loss must fall
        opt.zero_grad()
        loss = F.cross_entropy(m(x[mine]), y[mine])
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert_identical(list(m.parameters()), "after the section's training")
    assert loss.item() < 0.5 * first, (first, loss.item())
    assert hvd.stats()["sparse.chunks_sent"] > 0


@section("AMP on the device: autocast + GradScaler, overflow on the last rank only")
def _():
    # fp16 on CUDA (PyTorch's AMP recipe); CPU autocast takes bfloat16.
    amp_dtype = torch.float16 if DEV.type == "cuda" else torch.bfloat16
    m = model()
    scaler = torch.amp.GradScaler(DEV.type, init_scale=2.0 ** 10)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    hvd.broadcast_parameters(m.state_dict(), 0)
    scales = []
    for step in range(6):
        x, y = batches(step)
        x = x[R * B:(R + 1) * B].clone()
        if step == 3 and R == N - 1:
            x[0, 0] = float("inf")  # this rank's gradients overflow; the sum does too
        opt.zero_grad()
        with torch.autocast(DEV.type, dtype=amp_dtype):
            loss = F.cross_entropy(m(x), y[R * B:(R + 1) * B])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales[3] == scales[2] / 2, scales  # every rank skipped step 3
    assert_identical(list(m.parameters()) + [torch.tensor(scales)], "AMP weights and scales")
    assert all(torch.isfinite(p).all() for p in m.parameters())


@section("SyncBatchNorm on the device matches BatchNorm on the full batch")
def _():
    g = torch.Generator().manual_seed(7)
    x_all = (torch.randn(N * 6, 4, generator=g) * 3 + 1).to(DEV)
    w_all = torch.randn(N * 6, 4, generator=g).to(DEV)
    sbn = hvd.SyncBatchNorm(4).to(DEV)
    bn = torch.nn.BatchNorm1d(4).to(DEV)
    x = x_all[R * 6:(R + 1) * 6].clone().requires_grad_()
    out = sbn(x)
    (out * w_all[R * 6:(R + 1) * 6]).sum().backward()
    xr = x_all.clone().requires_grad_()
    ref = bn(xr)
    (ref * w_all).sum().backward()
    assert out.device == DEV and x.grad.device == DEV
    close([out], [ref[R * 6:(R + 1) * 6]], 1e-5)
    # The reference's loss sums every rank's rows; SyncBatchNorm's gradient
    # sums the ranks' losses the same way, so the rows' gradients agree.
    close([x.grad], [xr.grad[R * 6:(R + 1) * 6]], 1e-5)
    close([sbn.running_mean, sbn.running_var], [bn.running_mean, bn.running_var], 1e-5)


sys.stdout.write(f"done (size {N}) failed={len(FAILED)}\n")  # one write: lines of ranks interleave
sys.stdout.flush()
raise SystemExit(1 if FAILED else 0)
