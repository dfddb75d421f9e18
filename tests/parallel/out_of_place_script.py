# out_of_place_script.py — the out-of-place allreduce (numpy API: input and
# output are different buffers) against the in-place one on the same data.
# The ring reads the input itself there (Note [Out-of-place ring],
# native/ring_allreduce.cc) instead of copying it into the output first, so
# the two paths are different code: they must give the same bits, on every
# rank, for every dtype and op, for sizes that split into uneven segments
# and (GRADFLOW_RING_PIPELINE_BYTES is small in the test) several pieces per
# segment. Also checks the copy counter: no copy on the ring, the input
# untouched, and a copy where the input cannot be read directly (prescale).
# Arg: the expected algorithm name ("ring" or another: then a copy is expected).
import sys

import numpy as np
import torch

import gradflow as gf
import gradflow.torch as gt

gf.init()
R, N = gf.rank(), gf.size()
ALGO = sys.argv[1]
OPS = {"Sum": gf.Sum, "Average": gf.Average, "Min": gf.Min, "Max": gf.Max, "Product": gf.Product}
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]
SIZES = [1, N - 1 or 1, 7, 1000, 40_003]


def data(dtype, n, rank):
    rng = np.random.default_rng(1000 * rank + n)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5, 6, n).astype(dtype)
    return (rng.standard_normal(n) * 3).astype(dtype)


def reference(dtype, n, op):
    stack = np.stack([data(dtype, n, r).astype(np.float64) for r in range(N)])
    return {"Sum": stack.sum(0), "Average": stack.mean(0), "Min": stack.min(0),
            "Max": stack.max(0), "Product": stack.prod(0)}[op]


k = 0
for dtype in DTYPES:
    for n in SIZES:
        for opname, op in OPS.items():
            if dtype == np.float16 and opname == "Product":
                continue  # overflows fp16 for no purpose of this test
            x = data(dtype, n, R)
            before = x.copy()
            c0 = gf.stats().get("copy_in_bytes", 0.0)
            out = gf.allreduce(x, op=op, name=f"oop.{k}")
            copied = gf.stats().get("copy_in_bytes", 0.0) - c0
            inplace = x.copy()
            gt.allreduce_(torch.from_numpy(inplace), op=op, name=f"ip.{k}")  # the in-place path
            k += 1
            what = f"{np.dtype(dtype).name} n={n} {opname}"
            assert np.array_equal(x, before), f"rank {R}: {what}: the input was modified"
            assert out.dtype == x.dtype and out.shape == x.shape, what
            assert np.array_equal(out.view(np.uint8), inplace.view(np.uint8)), (
                f"rank {R}: {what}: out of place differs from in place: {out[:5]} vs {inplace[:5]}")
            tol = {np.float16: 2e-2, np.float32: 1e-5}.get(dtype, 1e-12)
            if opname == "Average" and np.issubdtype(dtype, np.integer):
                pass  # integer averages truncate; bitwise equality above is the check
            else:
                assert np.allclose(out.astype(np.float64), reference(dtype, n, opname),
                                   rtol=tol, atol=tol * 10), f"rank {R}: {what}: wrong values"
            # every rank ends with the same bits
            allb = gf.allgather(out.view(np.uint8).reshape(1, -1), name=f"oop.check.{k}")
            assert all(np.array_equal(allb[0], allb[i]) for i in range(N)), what
            if ALGO == "ring" and N > 1:
                assert copied == 0, f"rank {R}: {what}: copied {copied} bytes on the ring"
            else:
                assert copied == x.nbytes, f"rank {R}: {what}: copied {copied}, want {x.nbytes}"

# prescale: the input is scaled first, so it is copied (never modified)
x = data(np.float32, 1000, R)
before = x.copy()
c0 = gf.stats().get("copy_in_bytes", 0.0)
out = gf.allreduce(x, op=gf.Sum, prescale_factor=0.5, name="oop.prescale")
assert gf.stats().get("copy_in_bytes", 0.0) - c0 == x.nbytes
assert np.array_equal(x, before)
assert np.allclose(out, reference(np.float32, 1000, "Sum") * 0.5, rtol=1e-5, atol=1e-5)
print(f"ok out-of-place {k} cases (size {N})", flush=True)
gf.shutdown()
