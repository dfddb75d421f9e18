"""Property-based checks of the numpy collectives (hypothesis), SPMD at any N.

Only rank 0 runs hypothesis. Each example is a *batch* of collectives: kinds,
dtypes, ops, shapes (0-sized dims and 0-d included), arbitrary unicode names,
the order in which each rank submits and waits, and sometimes one rank that
submits a different shape / dtype / op / root / kind. Rank 0 pickles the
batch and broadcasts it with gradflow itself; every rank runs it and the
verdicts are allgathered back, so hypothesis (on rank 0 alone) decides what
to try next and shrinks a failure to a minimal batch while the other ranks
follow. Properties:
  - valid collectives match a numpy reference computed from (seed, rank);
  - a locally invalid one (Average or Sum of bools, reducescatter of a
    0-d array, a prescale/postscale factor on a bool tensor) raises at
    submit on every rank, and the runtime keeps working;
  - pre/postscale factors scale floating results, and integer ones as
    Horovod does (in double, truncated toward zero; Average of integers is
    a postscale of 1/size); big-endian inputs give
    the same results as native ones;
  - a cross-rank mismatch raises GradflowError naming the tensor on every
    rank, within --error-bound seconds; the runtime keeps working after it.
A crash or hang fails the pytest wrapper (test_properties.py).

  --examples N  (env GRADFLOW_PROPERTY_EXAMPLES, default 25)
  --seed S      (env GRADFLOW_PROPERTY_SEED, default 0)
"""
import argparse
import os
import pickle
import sys
import time

import numpy as np

import gradflow as gf

p = argparse.ArgumentParser()
p.add_argument("--examples", type=int, default=int(os.environ.get("GRADFLOW_PROPERTY_EXAMPLES", "25")))
p.add_argument("--seed", type=int, default=int(os.environ.get("GRADFLOW_PROPERTY_SEED", "0")))
p.add_argument("--error-bound", type=float, default=20.0, help="seconds a batch may take")
ARGS = p.parse_args()

# A rank-local surprise (a bug) must not hang the others: stalled names fail.
# Not too soon: while rank 0's hypothesis generates or shrinks a batch the
# others legitimately wait in the next broadcast (30 s leaves room for a
# loaded machine; a name only some ranks submit also ends by the bounded
# wait, Note [Bounded waits]).
os.environ.setdefault("GRADFLOW_STALL_CHECK_TIME", "5")
os.environ.setdefault("GRADFLOW_STALL_SHUTDOWN_TIME", "30")
# hypothesis is imported before init() on every rank: a slow first import on
# rank 0 must not happen while the others already wait for its first batch.
import hypothesis  # noqa: F401,E402
gf.init()
R, N = gf.rank(), gf.size()

KINDS = ["allreduce", "allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
DTYPES = ["uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"]
FLOAT = {"float16", "bfloat16", "float32", "float64"}
OPS = [gf.Sum, gf.Average, gf.Min, gf.Max, gf.Product]
WIRES = {"none": gf.Compression.none, "fp16": gf.Compression.fp16, "bf16": gf.Compression.bf16}


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 - installed with TensorFlow
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def locally_invalid(kind, dtype, op, shape, name="", scale=(1.0, 1.0)):
    """The error every rank raises at submit for this request, or None."""
    if "\x00" in name:
        return ValueError
    if kind == "reducescatter" and len(shape) == 0:
        return ValueError
    if kind in ("allreduce", "reducescatter"):
        if dtype == "bool" and op not in (gf.Min, gf.Max):
            return gf.GradflowError
        if dtype == "bool" and scale != (1.0, 1.0):
            return ValueError  # not computable: used to kill the background loop
    return None


def scale_of(c):
    return (c.get("prescale", 1.0), c.get("postscale", 1.0))


# ----------------------------------------------------------- the strategy (rank 0)

def batch_strategy(st, n):
    """A list of cases plus each rank's submit and wait orders."""

    @st.composite
    def case(draw):
        kind = draw(st.sampled_from(KINDS))
        dtype = draw(st.sampled_from(DTYPES))
        op = int(draw(st.sampled_from(OPS)))
        ndim = draw(st.integers(1 if kind == "alltoall" else 0, 3))
        first = draw(st.one_of(st.integers(0, 6), st.integers(0, 1 << 17)))  # above the ring piece size
        rest = draw(st.lists(st.integers(0, 4), min_size=max(ndim - 1, 0), max_size=max(ndim - 1, 0)))
        shape = tuple(([first] + rest)[:ndim])
        if int(np.prod(shape)) > (1 << 17):  # bound the total size, keep 0-sized dims
            shape = tuple(min(d, 3) for d in shape)
        c = {"kind": kind, "dtype": dtype, "op": op, "shape": shape,
             "name": draw(st.text(max_size=24)), "root": draw(st.integers(0, n - 1)),
             "seed": draw(st.integers(0, 2**31 - 1)), "mismatch": None, "wire": "none",
             "first_dims": [shape[0] if shape else 1] * n, "splits": None}
        if kind == "allreduce" and dtype == "float32":
            c["wire"] = draw(st.sampled_from(sorted(WIRES)))
        if kind == "allreduce" and draw(st.booleans()):
            c["prescale"], c["postscale"] = draw(st.sampled_from([(2.0, 1.0), (1.0, 0.5),
                                                                  (0.5, 4.0)]))
        c["big_endian"] = draw(st.booleans())
        if kind in ("allgather", "alltoall") and ndim > 0:
            # The first dimension may differ between ranks: valid.
            c["first_dims"] = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        if kind == "alltoall":
            c["splits"] = [draw(split_strategy(st, c["first_dims"][r], n)) for r in range(n)]
        if n > 1 and locally_invalid(kind, dtype, op, shape, c["name"], scale_of(c)) is None \
                and draw(st.booleans()):
            c["mismatch"] = draw(mismatch_strategy(st, c, n))
        return c

    return st.fixed_dictionaries({
        "cases": st.lists(case(), min_size=1, max_size=5),
        "orders": st.integers(0, 2**31 - 1),  # seeds for per-rank submit / wait permutations
    })


def split_strategy(st, rows, n):
    # n non-negative integers summing to rows
    return st.lists(st.integers(0, rows), min_size=n - 1, max_size=n - 1).map(
        lambda cuts: [b - a for a, b in zip([0] + sorted(cuts), sorted(cuts) + [rows])])


def mismatch_strategy(st, c, n):
    """One rank submits something incompatible (but locally valid)."""
    kind, shape = c["kind"], c["shape"]
    fields = ["dtype"]
    if kind in ("allreduce", "broadcast", "reducescatter"):
        fields.append("shape")
    if kind in ("allreduce", "reducescatter"):
        fields.append("op")
    if kind == "broadcast" and n > 1:
        fields.append("root")
    if kind in ("allgather", "alltoall") and shape:
        fields.append("trailing")
    if kind == "allreduce":
        fields.append("kind")

    @st.composite
    def draw_it(draw):
        field = draw(st.sampled_from(fields))
        rank = draw(st.integers(0, n - 1))
        if field == "dtype":
            ok = [d for d in DTYPES if d != c["dtype"]
                  and locally_invalid(kind, d, c["op"], shape, scale=scale_of(c)) is None]
            value = draw(st.sampled_from(ok))
        elif field == "shape":
            value = tuple(shape) + (1,) if draw(st.booleans()) or not shape else \
                (shape[0] + 1,) + tuple(shape[1:])
        elif field == "op":
            ok = [int(o) for o in OPS if int(o) != c["op"]
                  and locally_invalid(kind, c["dtype"], int(o), shape, scale=scale_of(c)) is None]
            if not ok:
                return {"rank": rank, "field": "kind", "value": "broadcast"}
            value = draw(st.sampled_from(ok))
        elif field == "root":
            value = draw(st.sampled_from([r for r in range(n) if r != c["root"]]))
        elif field == "trailing":
            value = tuple(shape[1:]) + (2,)
        else:
            value = "broadcast"
        return {"rank": rank, "field": field, "value": value}

    return draw_it()


# ------------------------------------------------------------ running a batch

def inputs(c, rank, dtype=None, shape=None):
    dtype = dtype or c["dtype"]
    shape = tuple(shape if shape is not None else c["shape"])
    if c["kind"] in ("allgather", "alltoall") and shape:
        shape = (c["first_dims"][rank],) + shape[1:]
    rng = np.random.default_rng([c["seed"], rank])
    k = rng.integers(-8, 9, size=shape)
    if dtype == "bool":
        return (k > 0).astype(bool)
    if dtype == "uint8":
        return (np.abs(k) % 4).astype(np.uint8)
    if dtype in FLOAT:
        return (k / 4.0).astype(np_dtype(dtype))
    return (k % 7 - 3).astype(dtype)


def reduce_ref(stack, op, dtype):
    wide = stack.astype(np.float64) if dtype in FLOAT else stack
    if op == gf.Sum:
        out = wide.sum(0) if dtype in FLOAT else wide.sum(0, dtype=dtype)
    elif op == gf.Average:
        out = wide.mean(0)
    elif op == gf.Min:
        out = wide.min(0)
    elif op == gf.Max:
        out = wide.max(0)
    else:
        out = wide.prod(0) if dtype in FLOAT else wide.prod(0, dtype=dtype)
    return np.asarray(out).astype(np_dtype(dtype))


def trunc_cast(v, dtype):
    """Horovod's double -> integer conversion (truncation toward zero);
    gradflow saturates where C++ would be undefined."""
    info = np.iinfo(dtype)
    t = np.trunc(np.asarray(v, np.float64))
    hi, lo = t >= float(info.max), t <= float(info.min)
    out = np.where(hi | lo, 0, t).astype(dtype)
    out[hi], out[lo] = info.max, info.min
    return out


def int_reference(xs, op, pre, post, dtype):
    """Integer allreduce as Horovod computes it: prescale each input, reduce
    in the dtype (wrapping), then one postscale (divided by N for Average)."""
    if pre != 1.0:
        xs = [trunc_cast(x.astype(np.float64) * pre, dtype) for x in xs]
    out = reduce_ref(np.stack(xs), gf.Sum if op == gf.Average else op, dtype)
    factor = post / N if op == gf.Average else post
    return out if factor == 1.0 else trunc_cast(out.astype(np.float64) * factor, dtype)


def expected(c):
    kind, dtype = c["kind"], c["dtype"]
    if kind == "allreduce":
        pre, post = scale_of(c)
        if dtype not in FLOAT and dtype != "bool":
            return int_reference([inputs(c, r) for r in range(N)], c["op"], pre, post, dtype)
        if (pre, post) != (1.0, 1.0):  # floating here (bool is refused)
            stack = np.stack([inputs(c, r).astype(np.float64) * pre for r in range(N)])
            return (reduce_ref(stack, c["op"], "float64") * post).astype(np_dtype(dtype))
        return reduce_ref(np.stack([inputs(c, r) for r in range(N)]), c["op"], dtype)
    if kind == "broadcast":
        return inputs(c, c["root"])
    if kind == "allgather":
        parts = [inputs(c, r) for r in range(N)]
        return np.concatenate([x if x.ndim else x.reshape(1) for x in parts])
    if kind == "alltoall":
        blocks = []
        for r in range(N):
            x = inputs(c, r)
            start = sum(c["splits"][r][:R])
            blocks.append(x[start:start + c["splits"][r][R]])
        return np.concatenate(blocks), np.array([c["splits"][r][R] for r in range(N)])
    xs = [inputs(c, r) for r in range(N)]  # reducescatter
    full = int_reference(xs, c["op"], 1.0, 1.0, dtype) if dtype not in FLOAT and dtype != "bool" \
        else reduce_ref(np.stack(xs), c["op"], dtype)
    rows = c["shape"][0]
    counts = [rows // N + (1 if q < rows % N else 0) for q in range(N)]
    return full[sum(counts[:R]):sum(counts[:R + 1])]


def close(got, exp, c, what):
    assert got.dtype == exp.dtype, f"{what}: dtype {got.dtype} != {exp.dtype}"
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    if c["dtype"] in FLOAT:
        tol = 2e-2 if c["dtype"] in ("float16", "bfloat16") or c["wire"] != "none" else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=tol,
                                   atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, exp, err_msg=what)


def submit(c, full_name):
    kind, dtype, shape, op, root, kind_eff = c["kind"], c["dtype"], c["shape"], c["op"], c["root"], c["kind"]
    mm = c["mismatch"]
    if mm and mm["rank"] == R:
        if mm["field"] == "dtype":
            dtype = mm["value"]
        elif mm["field"] == "shape":
            shape = mm["value"]
        elif mm["field"] == "op":
            op = mm["value"]
        elif mm["field"] == "root":
            root = mm["value"]
        elif mm["field"] == "trailing":
            shape = (shape[0],) + tuple(mm["value"])
        elif mm["field"] == "kind":
            kind_eff = mm["value"]
    x = inputs(c, R, dtype, shape)
    if c.get("big_endian"):  # swapped to native by gradflow; same results
        x = x.astype(x.dtype.newbyteorder(">"))
    if kind_eff == "allreduce":
        pre, post = scale_of(c)
        return gf.allreduce_async(x, op=op, name=full_name, compression=WIRES[c["wire"]],
                                  prescale_factor=pre, postscale_factor=post)
    if kind_eff == "broadcast":
        return gf.broadcast_async(x, root, name=full_name)
    if kind_eff == "allgather":
        return gf.allgather_async(x, name=full_name)
    if kind_eff == "alltoall":
        return gf.alltoall_async(x, splits=c["splits"][R], name=full_name)
    return gf.reducescatter_async(x, op=op, name=full_name)


def run_batch(batch, k):
    """Run one batch on this rank; returns a list of problems (empty = pass)."""
    cases = batch["cases"]
    rng = np.random.default_rng([batch["orders"], R])
    submit_order, wait_order = rng.permutation(len(cases)), rng.permutation(len(cases))
    names = [f"b{k}.{i}:{c['name']}" for i, c in enumerate(cases)]
    handles, outcome, problems = {}, {}, []
    t0 = time.monotonic()
    for i in submit_order:
        c = cases[i]
        want = locally_invalid(c["kind"], c["dtype"], c["op"], c["shape"], c["name"], scale_of(c))
        try:
            handles[i] = submit(c, names[i])
            if want is not None:
                problems.append(f"case {i}: submit did not raise {want.__name__}")
        except Exception as e:  # noqa: BLE001 - any surprise is a finding, not a crash
            if want is None or not isinstance(e, want):
                problems.append(f"case {i} {c}: unexpected {type(e).__name__} at submit: {e}")
            outcome[i] = "local-error"
    for i in wait_order:
        if i not in handles:
            continue
        c = cases[i]
        try:
            got = handles[i].wait()
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, gf.GradflowError):
                problems.append(f"case {i} {c}: wait raised {type(e).__name__}: {e}")
                continue
            outcome[i] = "error"
            if c["mismatch"] is None:
                problems.append(f"case {i}: valid collective raised: {e}")
            elif names[i] not in str(e):
                problems.append(f"case {i}: error does not name {names[i]!r}: {e}")
            continue
        outcome[i] = "ok"
        if c["mismatch"] is not None:
            problems.append(f"case {i}: mismatch {c['mismatch']} did not raise")
            continue
        try:
            exp = expected(c)
            if c["kind"] == "alltoall":
                close(got[0], exp[0], c, names[i])
                np.testing.assert_array_equal(got[1], exp[1])
            else:
                close(got, exp, c, names[i])
        except Exception as e:  # noqa: BLE001
            problems.append(f"case {i} {c}: wrong result: {type(e).__name__}: {e}")
    took = time.monotonic() - t0
    if took > ARGS.error_bound:
        problems.append(f"batch took {took:.1f} s > {ARGS.error_bound} s")
    return problems, outcome


# ----------------------------------------------------------- driver / follower

def bcast_obj(obj):
    """Rank 0's object on every rank, through gradflow's own broadcast."""
    payload = np.frombuffer(pickle.dumps(obj), np.uint8) if R == 0 else None
    n = gf.broadcast(np.array([0 if payload is None else payload.size], np.int64), 0, name="prop.len")
    buf = payload if R == 0 else np.empty(int(n[0]), np.uint8)
    return pickle.loads(gf.broadcast(buf, 0, name="prop.case").tobytes())


TALLY = {"ok": 0, "error": 0, "local-error": 0}
COUNTER = [0]


def one_batch(batch):
    """Every rank: receive the batch, run it, share verdicts. Rank 0 returns
    the ranks' problems."""
    batch = bcast_obj(batch)
    if batch is None:
        return None
    COUNTER[0] += 1
    problems, outcome = run_batch(batch, COUNTER[0])
    for v in outcome.values():
        TALLY[v] += 1
    if problems:
        print(f"rank {R}: batch {COUNTER[0]} failed: {problems}", flush=True)
    flags = gf.allgather(np.array([len(problems)], np.int64), name="prop.verdict")
    return [r for r in range(N) if flags[r]]


def driver():
    from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: PLC0415
    from hypothesis import strategies as st  # noqa: PLC0415

    @seed(ARGS.seed)
    @settings(max_examples=ARGS.examples, deadline=None, database=None,
              phases=[Phase.generate, Phase.shrink], print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(batch_strategy(st, N))
    def collectives_behave(batch):
        bad = one_batch(batch)
        assert not bad, f"ranks {bad} failed (their problems are printed above)"

    try:
        collectives_behave()
    finally:
        bcast_obj(None)  # release the followers


t_start = time.monotonic()
if R == 0:
    driver()
else:
    while one_batch(None) is not None:
        pass
# Still healthy after everything above.
np.testing.assert_array_equal(gf.allreduce(np.full(3, R, np.int64), op=gf.Sum, name="prop.after"),
                              np.full(3, N * (N - 1) // 2))
if R == 0:
    print(f"property OK on {N} ranks: {COUNTER[0]} batches, {TALLY} in "
          f"{time.monotonic() - t_start:.1f} s (seed {ARGS.seed})", flush=True)
