"""Floating min/max/sum/product over NaN, signed zeros and infinities, for
the algorithm in GRADFLOW_ALLREDUCE_ALGO: the result equals the kernels'
rule (NaN propagates; min takes -0 over +0, max +0 over -0; inf - inf is NaN)
and is bitwise identical on every rank. The "mpi" algorithm used MPI_MIN /
MPI_MAX for float32/float64, which keep whichever operand came second where
NaN or a signed zero meet: with MPICH, min(NaN, 1) was NaN on one rank and 1
on another (sizes below MPICH's reduce-scatter switch), and NaN was dropped
where the other algorithms keep it. (Its MPI_SUM / MPI_PROD still give NaNs
whose sign bit differed by rank, since each rank met the operands in its own
order and x86 keeps the first operand's NaN (inf - inf is -nan, np.nan +nan):
the algorithm now canonicalises NaNs after MPI_Allreduce. Bytes are compared
for every op.)"""
import os

import numpy as np

import gradflow as gf
from gradflow._dtypes import code_of_name, numpy_dtype
from _exact_checks import same_everywhere

ALGO = os.environ["GRADFLOW_ALLREDUCE_ALGO"]
gf.init()
R, N = gf.rank(), gf.size()
SPECIAL = [np.nan, -0.0, 0.0, np.inf, -np.inf, 1.0, -2.0]


def inputs(rank, size, dtype):
    """Rank `rank`'s array: special values at rotating positions, so every
    pair (and NaN against each value) meets on some element."""
    idx = (np.arange(size) * (rank + 1) + 3 * rank) % len(SPECIAL)
    return np.array([SPECIAL[i] for i in idx], np.float64).astype(dtype)


def pick(a, b, op):
    """The kernels' min/max of two float64 values."""
    if np.isnan(a) or np.isnan(b):
        return np.nan
    if a == b:  # signed zeros: min takes -0, max +0
        neg = np.signbit(a) or np.signbit(b) if op is gf.Min else np.signbit(a) and np.signbit(b)
        return -0.0 if neg and a == 0 else a
    return min(a, b) if op is gf.Min else max(a, b)


def reference(size, dtype, op):
    rows = [inputs(q, size, dtype).astype(np.float64) for q in range(N)]
    out = rows[0].copy()
    for row in rows[1:]:
        for i in range(size):
            if op in (gf.Min, gf.Max):
                out[i] = pick(out[i], row[i], op)
            elif op is gf.Sum:
                out[i] = out[i] + row[i]
            else:
                out[i] = out[i] * row[i]
    return out.astype(dtype)


def same_value(got, want):
    """Equal values, NaN where NaN is expected, and the sign of every zero."""
    both_nan = np.isnan(got) & np.isnan(want)
    eq = (got == want) & (np.signbit(got) == np.signbit(want))
    return bool((both_nan | eq).all())


checked = 0
for dtype in (np.float32, np.float64, np.float16):
    for op in (gf.Min, gf.Max, gf.Sum, gf.Product):
        for size in (1, 2, 4, 7, 1000):
            what = f"{ALGO} {np.dtype(dtype).name} {op} size {size}"
            x = inputs(R, size, dtype)
            with np.errstate(invalid="ignore"):
                want = reference(size, dtype, op)
            got = gf.allreduce(x, op=op, name=f"special.{np.dtype(dtype).name}.{int(op)}.{size}")
            assert got.dtype == want.dtype, what
            assert same_value(got, want), f"rank {R}: {what}: got {got[:8]}, want {want[:8]}"
            same_everywhere(got, what.replace(" ", "."))
            checked += 1


def mixed_nans(rank, size, dtype):
    """NaNs whose sign bit differs by rank at the same positions (i % 4 == 0),
    +inf on even ranks against -inf on odd ones (i % 4 == 1: inf - inf from
    2 ranks up), a NaN on one rank only (i % 4 == 2) and finite values. With
    MPI_SUM each rank met these in its own order and kept the first NaN: at 4
    ranks float32 sums differed in the sign bit of their NaNs."""
    i = np.arange(size)
    x = np.where(i % 4 == 3, i % 7 - 3.0, 1.0)
    x = np.where(i % 4 == 0, np.copysign(np.nan, np.where((rank + i // 4) % 2, -1.0, 1.0)), x)
    x = np.where(i % 4 == 1, np.inf if rank % 2 == 0 else -np.inf, x)
    x = np.where((i % 4 == 2) & (i % N == rank), np.nan, x)
    return x.astype(dtype)


dtypes = [np.float32, np.float64, np.float16, numpy_dtype(code_of_name("bfloat16"))]
for dtype in dtypes:
    for op in (gf.Sum, gf.Average, gf.Product):
        for size in (5, 64, 4099):
            what = f"{ALGO} mixed NaN {np.dtype(dtype).name} {op} size {size}"
            x = mixed_nans(R, size, dtype)
            with np.errstate(invalid="ignore", over="ignore"):
                rows = [mixed_nans(q, size, dtype).astype(np.float64) for q in range(N)]
                want = np.prod(rows, axis=0) if op is gf.Product else np.sum(rows, axis=0)
            got = gf.allreduce(x, op=op, name=f"mixed.{np.dtype(dtype).name}.{int(op)}.{size}")
            assert got.dtype == x.dtype, what
            g = got.astype(np.float64)
            assert (np.isnan(g) == np.isnan(want)).all(), f"rank {R}: {what}: NaN positions"
            fin = ~np.isnan(want)
            if op is gf.Average:  # sums and products here are exact in every dtype
                want = want / N
            assert np.allclose(g[fin], want[fin], rtol=1e-2), f"rank {R}: {what}: got {g[:8]}"
            same_everywhere(got, what.replace(" ", "."))
            checked += 1
print(f"special values OK on {N} ranks with {ALGO} ({checked} cases)", flush=True)
gf.shutdown()
