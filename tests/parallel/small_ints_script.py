# small_ints_script.py — int8 / int16 / uint16 tensors through the numpy and
# torch collectives (Horovod accepts them). Sum and product wrap around
# modulo 2^bits (two's complement for the signed types), min/max are exact;
# every result is checked against numpy on the stacked inputs, and every
# rank's bytes are compared. Arg "torch" adds the torch API.
import sys

import numpy as np

import gradflow as gf
from _exact_checks import check

gf.init()
R, N = gf.rank(), gf.size()
DTYPES = [np.int8, np.int16, np.uint16]
# Large magnitudes so that sums and products wrap around on 2 and 3 ranks.
BASE = {np.int8: [127, -128, 100, -7, 0, 1, 55, -90],
        np.int16: [32767, -32768, 30000, -7, 0, 1, 20000, -29000],
        np.uint16: [65535, 0, 60000, 7, 1, 300, 40000, 2]}
OPS = {"Sum": (gf.Sum, lambda s: s.sum(0, dtype=s.dtype)),
       "Min": (gf.Min, lambda s: s.min(0)),
       "Max": (gf.Max, lambda s: s.max(0)),
       "Product": (gf.Product, lambda s: s.prod(0, dtype=s.dtype))}


def x_of(r, dt):
    # Deterministic per rank; the arithmetic in int64 then cast wraps as the dtype does.
    return (np.array(BASE[dt], np.int64) * (r + 1) + 3 * r).astype(dt)


for dt in DTYPES:
    stack = np.stack([x_of(r, dt) for r in range(N)])
    nm = np.dtype(dt).name
    for opname, (op, ref) in OPS.items():
        check(gf.allreduce(x_of(R, dt), op=op, name=f"{nm}.{opname}"), ref(stack), f"{nm} {opname}")
    check(gf.allgather(x_of(R, dt)[None, :]), stack, f"{nm} allgather")
    check(gf.broadcast(x_of(R, dt), root_rank=N - 1), x_of(N - 1, dt), f"{nm} broadcast")
    rows = np.tile(x_of(R, dt), (N, 1))
    check(gf.reducescatter(rows, op=gf.Sum)[0], stack.sum(0, dtype=dt), f"{nm} reducescatter")
    # Average of integers follows Horovod (sum, then times 1/size in double,
    # truncated toward zero); int_scaling_script.py covers the scale factors.
    total = stack.sum(0, dtype=dt).astype(np.float64)
    check(gf.allreduce(x_of(R, dt), op=gf.Average, name=f"{nm}.Average"),
          np.trunc(total * (1.0 / N)).astype(dt), f"{nm} Average")
print(f"ok numpy (size {N})", flush=True)

if "torch" in sys.argv[1:]:
    import torch

    import gradflow.torch as hvd

    for dt in DTYPES:
        nm = np.dtype(dt).name
        stack = np.stack([x_of(r, dt) for r in range(N)])
        t = torch.from_numpy(x_of(R, dt))
        for opname, (op, ref) in OPS.items():
            got = hvd.allreduce(t, op=op, name=f"t.{nm}.{opname}")
            assert got.dtype == t.dtype
            check(got.numpy(), ref(stack), f"torch {nm} {opname}")
            inplace = t.clone()
            hvd.allreduce_(inplace, op=op, name=f"t_.{nm}.{opname}")
            check(inplace.numpy(), ref(stack), f"torch in-place {nm} {opname}")
        check(hvd.allgather(t[None, :]).numpy(), stack, f"torch {nm} allgather")
        check(hvd.broadcast(t, 0).numpy(), x_of(0, dt), f"torch {nm} broadcast")
        outs = hvd.grouped_allreduce([t, t[:3].clone()], op=hvd.Sum)
        check(outs[1].numpy(), stack[:, :3].sum(0, dtype=dt), f"torch {nm} grouped")
    print(f"ok torch (size {N})", flush=True)

gf.shutdown()
print(f"ok done (size {N})", flush=True)
