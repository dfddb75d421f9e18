"""SPMD checks of the GradientFlow techniques through the numpy API:
allreduce algorithms (GRADFLOW_ALLREDUCE_ALGO), the 16-bit wire
(GRADFLOW_WIRE_DTYPE / compression=), and coarse-grained sparse chunks
(GRADFLOW_SPARSE_RATIO), each against a numpy reference."""
import os

import numpy as np

import gradflow as gf
from _exact_checks import same_everywhere

gf.init()
R, N = gf.rank(), gf.size()
ALGO = os.environ.get("GRADFLOW_ALLREDUCE_ALGO", "ring")
# What runs the 1.2 MB wire checks: auto's table gives the ring above 256 KiB.
BIG_ALGO = "ring" if ALGO == "auto" else ALGO


def data(rank, count, seed=0):
    return np.random.default_rng(1000 * seed + rank).standard_normal(count).astype(np.float32)


def check_algorithm_dense():
    for count in [0, 1, N + 1, 4097, 1 << 20]:
        for dtype in [np.float32, np.float64, np.int32, np.float16]:
            x = (data(R, count) * 8).astype(dtype)
            got = gf.allreduce(x, op=gf.Sum, name=f"alg.{count}.{np.dtype(dtype).name}")
            ref = sum((data(r, count) * 8).astype(dtype).astype(np.float64) for r in range(N))
            tol = 2e-2 * N if dtype == np.float16 else 1e-4
            np.testing.assert_allclose(got.astype(np.float64), ref if count else np.zeros(0), rtol=tol, atol=tol)
            same_everywhere(got, f"alg.{count}.{np.dtype(dtype).name}")
    got = gf.allreduce(np.arange(10, dtype=np.float32) + R, op=gf.Max, name="alg.max")
    np.testing.assert_array_equal(got, np.arange(10, dtype=np.float32) + N - 1)
    st = gf.stats()
    if ALGO == "auto":  # the sizes above straddle auto's 256 KiB threshold (one node)
        assert st.get("allreduce.count.two-sync.fp32", 0) > 0 and st.get("allreduce.count.ring.fp32", 0) > 0, st
    else:
        assert st.get(f"allreduce.count.{ALGO}.fp32", 0) == st["allreduce.count"], st


def check_wire(compression, wire_name):
    count = 300_001
    x = data(R, count, seed=1)
    h = gf.allreduce_async(x, op=gf.Sum, name=f"wire.{wire_name}", compression=compression)
    got = h.wait()
    same_everywhere(got, f"wire.{wire_name}")
    exact = sum(data(r, count, seed=1).astype(np.float64) for r in range(N))
    err = np.abs(got - exact).max()
    if wire_name == "fp16":
        # The same sum done the way fp16 compression works elsewhere (cast to
        # fp16, every partial sum rounded to fp16) is less accurate.
        acc = data(0, count, seed=1).astype(np.float16)
        for r in range(1, N):
            acc = (acc + data(r, count, seed=1).astype(np.float16)).astype(np.float16)
        err_fp16_sum = np.abs(acc.astype(np.float64) - exact).max()
        mean_wire = np.abs(got - exact).mean()
        mean_fp16 = np.abs(acc.astype(np.float64) - exact).mean()
        # With 2 ranks one fp32 sum rounded once can equal one fp16 addition;
        # from 3 ranks on the fp16 chain rounds more often and must lose.
        if N > 2:
            assert mean_wire < mean_fp16 and err <= err_fp16_sum, (mean_wire, mean_fp16, err, err_fp16_sum)
        elif N == 2:
            assert mean_wire <= mean_fp16 and err <= err_fp16_sum, (mean_wire, mean_fp16, err, err_fp16_sum)
        assert err < 5e-3 * N
        assert not h.wire_overflow
    else:
        assert err < 5e-2 * N
    if N > 1:  # 16-bit bytes on the wire: about 2(N-1)/N of the buffer at 2 bytes each
        sent = gf.stats().get(f"bytes_sent.{BIG_ALGO}.{wire_name}", 0)
        assert 0.9 <= sent / (2 * (N - 1) / N * count * 2) <= 1.1, (sent, gf.stats())


def check_overflow_flag():
    h = gf.allreduce_async(np.full(8, 40000.0, np.float32), op=gf.Sum, name="overflow", compression=gf.Compression.fp16)
    got = h.wait()
    if N > 1:
        assert np.isinf(got).all() and h.wire_overflow, got
    same_everywhere(got, "overflow")


def simulate_sparse(grads_per_rank, chunk, ratio):
    """numpy model of CSC for a sequence of steps: returns the reduced output per step."""
    n = grads_per_rank[0][0].size
    nchunks = -(-n // chunk)
    residual = [np.zeros(n, np.float64) for _ in range(N)]
    outs = []
    for step in range(len(grads_per_rank[0])):
        for r in range(N):
            residual[r] += grads_per_rank[r][step]
        imp = sum(np.array([np.abs(residual[r][c * chunk:(c + 1) * chunk]).sum() for c in range(nchunks)]) for r in range(N))
        k = max(1, min(nchunks, int(np.ceil(ratio * nchunks - 1e-9))))
        chosen = sorted(sorted(range(nchunks), key=lambda c: (-imp[c], c))[:k])
        out = np.zeros(n)
        for c in chosen:
            sl = slice(c * chunk, (c + 1) * chunk)
            out[sl] = sum(residual[r][sl] for r in range(N))
            for r in range(N):
                residual[r][sl] = 0
        outs.append(out)
    return outs


def check_sparse():
    chunk = int(os.environ["GRADFLOW_SPARSE_CHUNK"])
    ratio = float(os.environ["GRADFLOW_SPARSE_RATIO"])
    n, steps = 20 * chunk + 123, 4
    # Chunk scales differ strongly so the selection is unambiguous despite fp32 rounding.
    scale = np.repeat(np.linspace(0.1, 3.0, 21)[np.random.default_rng(5).permutation(21)], chunk)[:n]
    grads = [[(data(r, n, seed=10 + s) * scale).astype(np.float32) for s in range(steps)] for r in range(N)]
    expected = simulate_sparse([[g.astype(np.float64) for g in gr] for gr in grads], chunk, ratio)
    gf.reset_stats()
    for s in range(steps):
        got = gf.allreduce(grads[R][s], op=gf.Sum, name="sparse.grad")
        same_everywhere(got, f"sparse.{s}")
        np.testing.assert_allclose(got, expected[s], rtol=1e-4, atol=1e-4, err_msg=f"step {s}")
    st = gf.stats()
    # Average with pre/post scaling: the post-scale is applied to the sent
    # chunks only (the rest of the result is zero), which must give the same
    # numbers as scaling the whole result.
    pre, post = 0.5, 3.0
    expected_avg = simulate_sparse([[g.astype(np.float64) * pre for g in gr] for gr in grads], chunk, ratio)
    for s in range(steps):
        got = gf.allreduce(grads[R][s], op=gf.Average, name="sparse.avg", prescale_factor=pre,
                           postscale_factor=post)
        same_everywhere(got, f"sparse.avg.{s}")
        np.testing.assert_allclose(got, expected_avg[s] * post / N, rtol=1e-4, atol=1e-4,
                                   err_msg=f"average, step {s}")
        assert (got[expected_avg[s] == 0] == 0).all(), "unsent chunks must be exactly zero"
    if N > 1:
        dense_bytes = 2 * (N - 1) / N * n * 4 * steps
        assert st["sparse.chunks_sent"] == steps * max(1, int(np.ceil(ratio * 21 - 1e-9))), st
        assert st["bytes_sent"] < dense_bytes * (ratio + 0.05) + 4096, (st["bytes_sent"], dense_bytes)


if os.environ.get("GRADFLOW_SPARSE_RATIO"):
    check_sparse()
else:
    check_algorithm_dense()
    check_wire(gf.Compression.fp16, "fp16")
    check_wire(gf.Compression.bf16, "bf16")
    check_overflow_flag()
gf.barrier()
if R == 0:
    print("techniques OK on", N, "ranks with", ALGO)
