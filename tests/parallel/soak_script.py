"""Soak: many mixed collectives (allreduce of random sizes / dtypes / ops /
wire formats, allgather with ragged rows, broadcast from random roots,
alltoall with random splits), submitted in async windows of 1-8 and checked
against numpy. Every rank draws the same op sequence from a shared seed;
inputs are a function of (op index, rank), so references need no
communication. RSS is sampled from /proc/self/statm: after warm-up and at the
end; growth beyond --rss-bound-mb fails. No hang: the wrapper has a timeout.

  --ops N           (env GRADFLOW_SOAK_OPS, default 2000)
  --seed S          (env GRADFLOW_SOAK_SEED, default 0)
  --rss-bound-mb M  (default 64)
Prints "soak OK on N ranks: ..." on rank 0 with ops/s and the RSS samples.
"""
import argparse
import ctypes
import gc
import os
import resource
import time

import numpy as np

import gradflow as gf

p = argparse.ArgumentParser()
p.add_argument("--ops", type=int, default=int(os.environ.get("GRADFLOW_SOAK_OPS", "2000")))
p.add_argument("--seed", type=int, default=int(os.environ.get("GRADFLOW_SOAK_SEED", "0")))
p.add_argument("--rss-bound-mb", type=float, default=64.0)
ARGS = p.parse_args()

gf.init()
R, N = gf.rank(), gf.size()
PAGE = os.sysconf("SC_PAGE_SIZE")

DTYPES = ["uint8", "int32", "int64", "float16", "float32", "float64"]
FLOAT = {"float16", "float32", "float64"}


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc: give freed heap back first
except (OSError, AttributeError):
    _malloc_trim = None


def rss_mb():
    """Resident MiB after returning freed heap memory to the OS (so transient
    big buffers do not hide or fake a leak)."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def draw_op(rng, i):
    """The i-th op, identical on every rank (rng is seeded the same)."""
    kind = rng.choice(["allreduce"] * 5 + ["allgather", "broadcast", "alltoall"])
    dtype = str(rng.choice(DTYPES))
    big = rng.random() < 0.03
    count = int(rng.integers(0, 300_000)) if big else int(rng.integers(0, 5000))
    op = {"kind": str(kind), "dtype": dtype, "count": count, "seed": i}
    if kind == "allreduce":
        ops = [gf.Sum, gf.Min, gf.Max] + ([gf.Average] if dtype in FLOAT else [])
        op["op"] = int(rng.choice(ops))
        op["wire"] = str(rng.choice(["none", "fp16", "bf16"])) if dtype == "float32" else "none"
        # Stable names for most (the cache fast path), a fresh name for some
        # (the slow path and cache eviction).
        op["name"] = (f"soak.u{i}" if rng.random() < 0.2 else
                      f"soak.{dtype}.{op['op']}.{op['wire']}.{count}")
    elif kind == "allgather":
        op["rows"] = [int(x) for x in rng.integers(0, 50, size=N)]
        op["name"] = f"soak.ag.{i}"
    elif kind == "broadcast":
        op["root"] = int(rng.integers(0, N))
        op["name"] = f"soak.bc.{dtype}.{count}"
    else:
        op["splits"] = [[int(x) for x in rng.integers(0, 20, size=N)] for _ in range(N)]
        op["name"] = f"soak.a2a.{i}"
    return op


def data(op, rank, count=None, shape=None):
    count = op["count"] if count is None else count
    k = np.random.default_rng([op["seed"], rank]).integers(-6, 7, size=count)
    d = op["dtype"]
    x = (np.abs(k) % 5).astype(np.uint8) if d == "uint8" else (
        (k / 4.0).astype(d) if d in FLOAT else (k * (rank + 1)).astype(d))
    return x.reshape(shape) if shape is not None else x


WIRES = {"none": gf.Compression.none, "fp16": gf.Compression.fp16, "bf16": gf.Compression.bf16}


def submit(op):
    k = op["kind"]
    if k == "allreduce":
        return gf.allreduce_async(data(op, R), op=op["op"], name=op["name"],
                                  compression=WIRES[op["wire"]])
    if k == "allgather":
        return gf.allgather_async(data(op, R, op["rows"][R] * 3, (op["rows"][R], 3)), name=op["name"])
    if k == "broadcast":
        return gf.broadcast_async(data(op, R), op["root"], name=op["name"])
    rows = sum(op["splits"][R])
    return gf.alltoall_async(data(op, R, rows * 2, (rows, 2)), splits=op["splits"][R], name=op["name"])


def check(op, got):
    k, d = op["kind"], op["dtype"]
    if k == "allreduce":
        stack = np.stack([data(op, r) for r in range(N)]).astype(np.float64)
        ref = {gf.Sum: stack.sum(0), gf.Min: stack.min(0), gf.Max: stack.max(0),
               gf.Average: stack.mean(0)}[op["op"]]
        if d in FLOAT:
            tol = 1e-2 if d == "float16" or op["wire"] != "none" else 1e-6
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol,
                                       err_msg=op["name"])
        else:
            np.testing.assert_array_equal(got, ref.astype(d), err_msg=op["name"])
        assert got.dtype == np.dtype(d)
    elif k == "allgather":
        ref = np.concatenate([data(op, r, op["rows"][r] * 3, (op["rows"][r], 3)) for r in range(N)])
        np.testing.assert_array_equal(got, ref, err_msg=op["name"])
    elif k == "broadcast":
        np.testing.assert_array_equal(got, data(op, op["root"]), err_msg=op["name"])
    else:
        out, recv = got
        blocks = []
        for r in range(N):
            rows = sum(op["splits"][r])
            x = data(op, r, rows * 2, (rows, 2))
            start = sum(op["splits"][r][:R])
            blocks.append(x[start:start + op["splits"][r][R]])
        np.testing.assert_array_equal(out, np.concatenate(blocks), err_msg=op["name"])
        np.testing.assert_array_equal(recv, [op["splits"][r][R] for r in range(N)])


rng = np.random.default_rng(ARGS.seed)
done, samples, t0 = 0, [], time.monotonic()
warm = max(ARGS.ops // 5, 1)
while done < ARGS.ops:
    window = [draw_op(rng, done + j) for j in range(min(int(rng.integers(1, 9)), ARGS.ops - done))]
    order = np.random.default_rng([ARGS.seed, done, R]).permutation(len(window))  # per-rank order
    handles = {j: submit(window[j]) for j in order}
    for j in order[::-1]:
        check(window[j], handles[j].wait())
    before = done
    done += len(window)
    if before < warm <= done or done == ARGS.ops or done // (ARGS.ops // 10 or 1) != before // (ARGS.ops // 10 or 1):
        samples.append((done, round(rss_mb(), 1)))
elapsed = time.monotonic() - t0
warm_rss = next(mb for n, mb in samples if n >= warm)
growth = samples[-1][1] - warm_rss
all_growth = gf.allgather(np.array([growth]), name="soak.rss")
if R == 0:
    print(f"soak RSS (ops, MiB) on rank 0: {samples}; max rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
          flush=True)
assert (all_growth < ARGS.rss_bound_mb).all(), \
    f"RSS grew by {all_growth.tolist()} MiB after warm-up (bound {ARGS.rss_bound_mb} MiB)"
gf.barrier()
if R == 0:
    print(f"soak OK on {N} ranks: {ARGS.ops} ops in {elapsed:.1f} s ({ARGS.ops / elapsed:.0f} ops/s), "
          f"RSS growth after warm-up per rank {np.round(all_growth, 1).tolist()} MiB "
          f"(bound {ARGS.rss_bound_mb}), seed {ARGS.seed}", flush=True)
