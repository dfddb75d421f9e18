"""SPMD: the halving-doubling allreduce (GRADFLOW_ALLREDUCE_ALGO=halving-doubling)
on the native wire, bit for bit against a numpy model of its documented order
of reductions (tests/parallel/_hd_model.py), for float32/float64/float16 sums
and averages, int32 sum/min/max/product, bool min/max, sizes below the rank
count, uneven blocks and several pieces (the test sets 64 KiB pieces). Every
rank must end bitwise identical, the stats must show the algorithm ran and
the bytes each rank sent must be the model's. (The 16-bit wire:
wire_rounding_script.py.)"""

import numpy as np

import gradflow as gf
from _hd_model import bytes_sent, halving_doubling
from _exact_checks import same_everywhere

gf.init()
R, N = gf.rank(), gf.size()
OPS = {gf.Sum: lambda a, b: a + b, gf.Average: lambda a, b: a + b, gf.Min: np.minimum,
       gf.Max: np.maximum, gf.Product: lambda a, b: a * b}


def inputs(rank, count, dtype, seed):
    rng = np.random.default_rng(104729 * seed + rank)
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-3, 4, count).astype(dtype)
    # Full mantissas over several decades: the order of additions shows.
    return (rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)).astype(dtype)


def check(count, dtype, op, seed):
    name = f"hd.{np.dtype(dtype).name}.{op.name}.{count}"
    xs = [inputs(r, count, dtype, seed) for r in range(N)]
    before = gf.stats()
    got = gf.allreduce(xs[R].copy(), op=op, name=name)
    after = gf.stats()
    same_everywhere(got, name)
    with np.errstate(over="ignore"):
        want = halving_doubling(xs, OPS[op])
        if op == gf.Average:
            want = (want * (np.float32(1.0) / np.float32(N)) if dtype == np.float16 else
                    want * np.asarray(1.0 / N, dtype))
            want = want.astype(dtype)
    if got.tobytes() != want.tobytes():
        diff = np.flatnonzero(got != want)
        raise AssertionError(f"{name}: {diff.size} of {count} elements differ from the model, "
                             f"e.g. {diff[:5]}: got {got[diff[:5]]}, model {want[diff[:5]]}")
    key = "halving-doubling.fp32"  # the native wire is named fp32 for every dtype
    ran = after.get(f"allreduce.count.{key}", 0) - before.get(f"allreduce.count.{key}", 0)
    assert ran == 1, (name, {k: v for k, v in after.items() if k.startswith("allreduce.count")})
    sent = after.get(f"bytes_sent.{key}", 0) - before.get(f"bytes_sent.{key}", 0)
    es = np.dtype(dtype).itemsize
    assert sent == bytes_sent(R, N, count * es, es), (name, sent, bytes_sent(R, N, count * es, es))


seed = 0
for count in (1, max(1, N - 1), N + 1, 4097, 300_007):
    for dtype, ops in ((np.float32, (gf.Sum, gf.Average)), (np.float64, (gf.Sum,)),
                       (np.float16, (gf.Sum, gf.Average)),
                       (np.int32, (gf.Sum, gf.Min, gf.Max, gf.Product)),
                       (np.bool_, (gf.Min, gf.Max))):
        for op in ops:
            seed += 1
            check(count, dtype, op, seed)
gf.barrier()
if R == 0:
    print(f"halving-doubling OK on {N} ranks", flush=True)
