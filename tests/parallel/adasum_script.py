# adasum_script.py — op=Adasum (native/adasum_allreduce.*) checked against the
# numpy model in _adasum_model.py, on every rank, plus bitwise identity of
# the result across ranks. Every rank rebuilds every rank's input from seeds,
# so each can compute the reference itself. Args:
#   numpy   sizes incl. 1 element, not divisible by N, zero tensors, fused
#           tensors, float32/float64/float16, scaling, refusals (N = 1, 2, 4)
#   nonpow2 N not a power of two: a clear ValueError on every rank, runtime fine
#   torch   hvd.allreduce(op=hvd.Adasum) (+ in place, grouped, bfloat16) and
#           DistributedOptimizer(op=Adasum) training against a plain-torch
#           reference that applies the model's Adasum to each rank's gradients
import sys

import numpy as np

import gradflow as gf
from _adasum_model import adasum

gf.init()
R, N = gf.rank(), gf.size()
MODE = sys.argv[1]
TOL = {np.float32: 2e-6, np.float64: 1e-13, np.float16: 2e-3}


def data(seed: int, rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + rank)
    return (rng.standard_normal(n) * (1 + rank)).astype(dtype)


def check(got, want, dtype, what):
    """Close to the model (relative to the largest value) and identical on every rank."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    scale = max(1.0, float(np.max(np.abs(want.astype(np.float64)), initial=0.0)))
    assert err <= TOL[dtype] * scale, f"rank {R}: {what}: max error {err} (scale {scale})"
    mine = np.frombuffer(np.ascontiguousarray(got).tobytes(), np.uint8)
    every = gf.allgather(mine.reshape(1, -1), name=f"adasum.check.{what}")
    assert all((row == every[0]).all() for row in every), f"{what}: ranks differ bitwise"


def raises(fn, exc, text, what):
    try:
        fn()
    except exc as e:
        assert text in str(e), f"rank {R}: {what}: message {e!r} lacks {text!r}"
        return
    raise AssertionError(f"rank {R}: {what}: no {exc.__name__}")


def ok(what):
    if R == 0:
        print(f"ok {what} (size {N})", flush=True)


def numpy_mode():
    work = {np.float32: np.float32, np.float64: np.float64, np.float16: np.float32}
    # one tensor at a time: sizes below, at and off multiples of N
    for dtype in (np.float32, np.float64, np.float16):
        for seed, n in enumerate((1, 2, 3, 5, 8, 127, 1000, 4099)):
            mine = data(seed, R, n, dtype)
            want = adasum([[data(seed, r, n, dtype)] for r in range(N)], work[dtype])[0]
            check(gf.allreduce(mine, op=gf.Adasum), want.astype(dtype), dtype,
                  f"{np.dtype(dtype).name} n={n}")
    ok("sizes")
    # 2-d shape kept; raw int 2 means Adasum (Horovod's value)
    m = data(50, R, 12, np.float32).reshape(3, 4)
    want = adasum([[data(50, r, 12, np.float32)] for r in range(N)])[0].reshape(3, 4)
    check(gf.allreduce(m, op=2), want, np.float32, "2-d raw int")
    # zero tensor everywhere stays zero; zero on rank 0 only leaves the others' combination
    check(gf.allreduce(np.zeros(10, np.float32), op=gf.Adasum), np.zeros(10, np.float32),
          np.float32, "all zero")
    z = [np.zeros(9, np.float32) if r == 0 else data(51, r, 9, np.float32) for r in range(N)]
    check(gf.allreduce(z[R], op=gf.Adasum), adasum([[t] for t in z])[0], np.float32, "zero on 0")
    # identical inputs: adasum(a, a) = a; orthogonal inputs: the plain sum
    same = data(52, 0, 33, np.float64)
    check(gf.allreduce(same, op=gf.Adasum), same, np.float64, "identical inputs")
    if N > 1:
        ortho = np.zeros(N * 3, np.float64)
        ortho[R * 3:(R + 1) * 3] = R + 1.0
        check(gf.allreduce(ortho, op=gf.Adasum),
              np.repeat(np.arange(1.0, N + 1), 3), np.float64, "orthogonal inputs")
    ok("special")
    # scale invariance and post-scaling: adasum(s*x) = s*adasum(x)
    x = data(53, R, 100, np.float64)
    want = adasum([[data(53, r, 100, np.float64)] for r in range(N)], np.float64)[0]
    check(gf.allreduce(x, op=gf.Adasum, prescale_factor=4.0), 4.0 * want, np.float64, "prescale")
    check(gf.allreduce(x, op=gf.Adasum, postscale_factor=0.5), 0.5 * want, np.float64, "postscale")
    ok("scaling")
    # fused: several tensors (incl. empty and 1-element) in flight at once go
    # through one fusion buffer, each with its own dot products
    sizes = (7, 0, 1, 300, 64, 5)
    before = gf.stats().get("fusion.tensors", 0)
    for rep in range(3):
        hs = [gf.allreduce_async(data(60 + i, R, s, np.float32), op=gf.Adasum,
                                 name=f"fused.{rep}.{i}") for i, s in enumerate(sizes)]
        got = [gf.synchronize(h) for h in hs]
        want = adasum([[data(60 + i, r, s, np.float32) for i, s in enumerate(sizes)]
                       for r in range(N)])
        for i, (g, w) in enumerate(zip(got, want)):
            check(g, w, np.float32, f"fused rep {rep} tensor {i}")
    fused = gf.stats().get("fusion.tensors", 0) - before
    if N > 1:  # the per-tensor check above must have covered a fused group
        assert fused >= 2, f"no Adasum tensors were fused ({gf.stats()})"
    ok("fused")
    # a joined rank contributes zeros (as for Sum): adasum(x, 0) = x
    if N > 1:
        ins = [data(70, r, 21, np.float32) if r < N - 1 else np.zeros(21, np.float32)
               for r in range(N)]
        if R < N - 1:  # rank N-1 joins at once
            got = gf.allreduce(ins[R], op=gf.Adasum, name="adasum.join")
            want = adasum([[t] for t in ins])[0]
            err = float(np.max(np.abs(got - want)))
            assert err <= TOL[np.float32] * max(1.0, float(np.max(np.abs(want)))), err
        gf.join()
        ok("join")
    # refusals, on every rank; the runtime keeps working
    raises(lambda: gf.allreduce(np.arange(4, dtype=np.int32), op=gf.Adasum), ValueError,
           "Adasum of int32", "int32")
    raises(lambda: gf.reducescatter(np.ones((N, 2), np.float32), op=gf.Adasum), ValueError,
           "only allreduce supports op=Adasum", "reducescatter")
    raises(lambda: gf.allreduce(np.ones(4, np.float32), op=gf.Adasum,
                                compression=gf.Compression.fp16), ValueError, "16-bit wire", "fp16")
    raises(lambda: gf.allreduce(np.ones(4, np.float32), op=gf.Adasum, sparse_ratio=0.5),
           ValueError, "sparse_ratio", "sparse")
    s = gf.allreduce(np.full(3, R + 1.0), op=gf.Sum)
    assert (s == N * (N + 1) / 2).all(), s
    ok("refusals")


def nonpow2_mode():
    for op in (gf.Adasum, 2):
        raises(lambda: gf.allreduce(np.ones(5, np.float32), op=op), ValueError,
               f"power-of-two number of ranks (as in Horovod), but it runs on {N} ranks", "size")
    s = gf.allreduce(np.full(3, R + 1.0), op=gf.Sum)
    assert (s == N * (N + 1) / 2).all(), s
    ok("nonpow2")


def torch_mode():
    import torch

    import gradflow.torch as hvd
    from _torch_common import assert_identical, batch, digits, mlp
    import torch.nn.functional as F

    def t(seed, n, dtype=np.float32):
        return torch.from_numpy(data(seed, R, n, dtype))

    want = adasum([[data(70, r, 50, np.float32)] for r in range(N)])[0]
    check(hvd.allreduce(t(70, 50), op=hvd.Adasum).numpy(), want, np.float32, "torch allreduce")
    x = t(70, 50)
    hvd.allreduce_(x, op=hvd.Adasum)
    check(x.numpy(), want, np.float32, "torch allreduce_")
    sizes = (3, 17, 1)
    got = hvd.grouped_allreduce([t(80 + i, s) for i, s in enumerate(sizes)], op=hvd.Adasum)
    want = adasum([[data(80 + i, r, s, np.float32) for i, s in enumerate(sizes)]
                   for r in range(N)])
    for i, (g, w) in enumerate(zip(got, want)):
        check(g.numpy(), w, np.float32, f"torch grouped {i}")
    # bfloat16: widened to fp32 for the whole reduction, rounded once
    b = torch.from_numpy(data(90, R, 40, np.float32)).bfloat16()
    got = hvd.allreduce(b, op=hvd.Adasum).float().numpy()
    wantb = adasum([[torch.from_numpy(data(90, r, 40, np.float32)).bfloat16().float().numpy()]
                    for r in range(N)])[0]
    wantb = torch.from_numpy(wantb).bfloat16().float().numpy()
    assert np.allclose(got, wantb, rtol=1e-2, atol=1e-2), (got, wantb)
    check(got, got, np.float32, "torch bfloat16 identical")
    ok("torch ops")

    # DistributedOptimizer(op=Adasum): each parameter's gradient is Adasum-combined,
    # then the wrapped step runs (momentum SGD here, so the optimizer state
    # follows the combined gradient). Reference: plain torch on every rank.
    X, Y = digits()
    per_rank, steps = 16, 4
    model = mlp(3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
    opt = hvd.DistributedOptimizer(make(model), named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    ref = mlp(3)
    ref_opt = make(ref)
    for step in range(steps):
        opt.zero_grad()
        xb, yb = batch(X, Y, step, R, N, per_rank)
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        grads = []  # every rank's gradients of the reference model
        for r in range(N):
            ref.zero_grad()
            xr, yr = batch(X, Y, step, r, N, per_rank)
            F.cross_entropy(ref(xr), yr).backward()
            grads.append([p.grad.detach().numpy().copy() for p in ref.parameters()])
        combined = adasum(grads)
        if N > 1 and step == 0:  # the check below can tell Adasum from an average
            gap = max(float(np.abs(c - np.mean([g[i] for g in grads], 0).reshape(-1)).max())
                      for i, c in enumerate(combined))
            assert gap > 1e-3, f"Adasum and average gradients are too close ({gap})"
        for p, g in zip(ref.parameters(), combined):
            p.grad = torch.from_numpy(g.reshape(p.shape))
        ref_opt.step()
    assert_identical(model.parameters(), "DistributedOptimizer(op=Adasum)")
    for p, q in zip(model.parameters(), ref.parameters()):
        err = (p.detach() - q.detach()).abs().max().item()
        assert err <= 1e-5, f"rank {R}: optimizer differs from the reference by {err}"
    # the optimizer refuses what Adasum cannot do, at construction
    raises(lambda: hvd.DistributedOptimizer(make(mlp(4)), op=hvd.Adasum,
                                            compression=hvd.Compression.fp16),
           ValueError, "Compression.none", "optimizer fp16")
    raises(lambda: hvd.DistributedOptimizer(make(mlp(4)), op=hvd.Adasum, sparse_ratio=0.1),
           ValueError, "sparse_ratio", "optimizer sparse")
    ok("torch optimizer")


{"numpy": numpy_mode, "nonpow2": nonpow2_mode, "torch": torch_mode}[MODE]()
gf.barrier()
ok("done")
gf.shutdown()
