# int_scaling_script.py — Average, prescale and postscale on integer tensors
# follow Horovod (its CPU ScaleBuffer: factor * x in double, converted back,
# truncating toward zero; Average is a postscale of postscale/size). Checked
# for every integer dtype against numpy on the stacked inputs — allreduce
# (single and fused), reducescatter, and the torch API with "torch" — and
# every rank's bytes are compared. Out-of-range products saturate.
import sys

import numpy as np

import gradflow as gf
from _exact_checks import check

gf.init()
R, N = gf.rank(), gf.size()
DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64]
# Mixed signs (truncation toward zero differs from floor for negatives) and
# sums that are not multiples of 2 or 3.
BASE = {np.uint8: [1, 2, 5, 7, 11, 40, 0, 3],
        np.int8: [-7, 5, -1, 13, 0, -20, 9, 1],
        np.int16: [-701, 505, -1, 1303, 0, -2000, 999, 7],
        np.uint16: [701, 505, 1, 1303, 0, 2000, 999, 7],
        np.int32: [-70001, 50005, -1, 130003, 0, -200000, 99999, 7],
        np.int64: [-7000000001, 5000000005, -1, 13, 0, -20, 2**40 + 3, 7]}
# (op, prescale, postscale) cases; factors that are not exact in binary too.
CASES = [(gf.Average, 1.0, 1.0), (gf.Sum, 0.3, 1.0), (gf.Sum, 1.0, 0.7),
         (gf.Average, 2.5, 0.3), (gf.Average, -1.5, 1.0)]


def x_of(r, dt):
    b = np.array(BASE[dt], np.int64)
    if np.dtype(dt).kind == "u":
        return (b + 3 * r).astype(dt)
    return (b * (r + 1) + 3 * r * np.sign(b)).astype(dt)


def trunc_cast(v, dt):
    """Horovod's double -> integer conversion (truncate), saturating outside
    the dtype's range (C++ leaves that undefined; gradflow saturates)."""
    info = np.iinfo(dt)
    t = np.trunc(np.nan_to_num(np.asarray(v, np.float64), nan=0.0))
    hi, lo = t >= float(info.max), t <= float(info.min)
    out = np.where(hi | lo, 0, t).astype(dt)
    out[hi], out[lo] = info.max, info.min
    return out


def reference(xs, dt, op, pre, post):
    if pre != 1.0:
        xs = [trunc_cast(x.astype(np.float64) * pre, dt) for x in xs]
    total = np.stack(xs).sum(0, dtype=dt)  # wraps as the core's sum does
    factor = post / N if op == gf.Average else post
    return total if factor == 1.0 else trunc_cast(total.astype(np.float64) * factor, dt)


nontrivial = 0  # cases where truncation actually dropped a fraction
for dt in DTYPES:
    nm = np.dtype(dt).name
    xs = [x_of(r, dt) for r in range(N)]
    for i, (op, pre, post) in enumerate(CASES):
        want = reference(xs, dt, op, pre, post)
        exact = np.stack(xs).astype(np.float64).sum(0) * (post / N if op == gf.Average else post)
        nontrivial += int(pre == 1.0 and not np.array_equal(exact, np.trunc(exact)))
        tag = f"{nm}.{i}"
        check(gf.allreduce(xs[R], op=op, prescale_factor=pre, postscale_factor=post,
                           name=f"ar.{tag}"), want, f"allreduce {tag}")
        # Fused: two tensors in one response, scaled together.
        h1 = gf.allreduce_async(xs[R], op=op, prescale_factor=pre, postscale_factor=post,
                                name=f"f1.{tag}")
        h2 = gf.allreduce_async(xs[R][::-1].copy(), op=op, prescale_factor=pre,
                                postscale_factor=post, name=f"f2.{tag}")
        check(h1.wait(), want, f"fused 1 {tag}")
        check(h2.wait(), reference([x[::-1].copy() for x in xs], dt, op, pre, post),
              f"fused 2 {tag}")
        rows = [np.tile(x, (N, 1)) for x in xs]
        got = gf.reducescatter(rows[R], op=op, prescale_factor=pre, postscale_factor=post,
                               name=f"rs.{tag}")
        check(got, reference(rows, dt, op, pre, post)[R:R + 1], f"reducescatter {tag}")
    # Saturation: a prescale that leaves the range clamps before the
    # (wrapping) sum, as the reference says.
    info = np.iinfo(dt)
    big = np.array([info.max // 2 + 1, -(info.max // 2) if info.min < 0 else 1], dt)
    check(gf.allreduce(big, op=gf.Sum, prescale_factor=3.0, name=f"sat.{nm}"),
          reference([big] * N, dt, gf.Sum, 3.0, 1.0), f"saturate {nm}")
assert nontrivial > 0, "no case exercised truncation"
# bool still cannot be scaled or averaged (Horovod's ScaleBuffer refuses it too).
for kw in ({"op": gf.Average}, {"op": gf.Max, "prescale_factor": 2.0}):
    try:
        gf.allreduce(np.array([True, False]), **kw)
    except ValueError:
        pass
    else:
        raise AssertionError(f"bool {kw} did not raise")
print(f"ok numpy (size {N})", flush=True)

if "torch" in sys.argv[1:]:
    import torch

    import gradflow.torch as hvd

    for dt in DTYPES:
        nm = np.dtype(dt).name
        xs = [x_of(r, dt) for r in range(N)]
        for i, (op, pre, post) in enumerate(CASES):
            want = reference(xs, dt, op, pre, post)
            t = torch.from_numpy(xs[R].copy())
            got = hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post,
                                name=f"t.{nm}.{i}")
            assert got.dtype == t.dtype
            check(got.numpy(), want, f"torch {nm} {i}")
            hvd.allreduce_(t, op=op, prescale_factor=pre, postscale_factor=post,
                           name=f"t_.{nm}.{i}")
            check(t.numpy(), want, f"torch in-place {nm} {i}")
        # Horovod's spelling: average=True on an integer tensor.
        t = torch.from_numpy(xs[R].copy())
        check(hvd.allreduce(t, average=True, name=f"avg.{nm}").numpy(),
              reference(xs, dt, gf.Average, 1.0, 1.0), f"torch average=True {nm}")
        outs = hvd.grouped_allreduce([t, t[:3].clone()], op=hvd.Average, name=f"g.{nm}")
        check(outs[1].numpy(), reference([x[:3] for x in xs], dt, gf.Average, 1.0, 1.0),
              f"torch grouped {nm}")
    print(f"ok torch (size {N})", flush=True)

gf.shutdown()
print(f"ok done (size {N})", flush=True)
