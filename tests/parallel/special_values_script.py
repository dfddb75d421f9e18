"""Floating min/max/sum/product over NaN, signed zeros and infinities, for
the algorithm in GRADFLOW_ALLREDUCE_ALGO: the result equals the kernels'
rule (NaN propagates; min takes -0 over +0, max +0 over -0; inf - inf is NaN)
and is bitwise identical on every rank. The "mpi" algorithm used MPI_MIN /
MPI_MAX for float32/float64, which keep whichever operand came second where
NaN or a signed zero meet: with MPICH, min(NaN, 1) was NaN on one rank and 1
on another (sizes below MPICH's reduce-scatter switch), and NaN was dropped
where the other algorithms keep it. (Its MPI_SUM / MPI_PROD still give NaNs
whose sign bit may differ by rank: positions are compared there.)"""
import os

import numpy as np

import gradflow as gf
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
            if ALGO == "mpi" and op in (gf.Sum, gf.Product):
                # MPI_SUM / MPI_PROD keep the first operand's NaN, whose sign
                # bit differs (inf - inf gives -nan on x86, np.nan is +nan):
                # the same NaN positions, not the same NaN bits.
                got = np.where(np.isnan(got), np.array(np.nan, dtype), got)
            same_everywhere(got, what.replace(" ", "."))
            checked += 1
print(f"special values OK on {N} ranks with {ALGO} ({checked} cases)", flush=True)
gf.shutdown()
