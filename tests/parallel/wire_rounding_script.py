"""The 16-bit wire's rounding, bit for bit, against a numpy model of the
documented algorithm (GRADFLOW_ALLREDUCE_ALGO = ring | two-sync | mpi |
recursive-doubling | halving-doubling):
  ring:     the partial sum is rounded to 16 bits at every hop of the
            reduce-scatter (fp32 add of the hop's own value, then encode);
  two-sync, mpi: the owner sums all ranks' 16-bit shards in fp32 in rank
            order and rounds once;
  recursive-doubling: each exchange adds the two partners' rounded partials
            (lower rank first) in fp32; the result is rounded once more
            (tests/parallel/_rd_model.py);
  halving-doubling: the receiver of each fold and reduce-scatter exchange
            adds the sender's rounded partial to its own fp32 partial; the
            owner of a block rounds it once (tests/parallel/_hd_model.py).
Then every rank holds the owner's rounded values (bitwise identical). Inputs
have full fp32 mantissas and span fp16's subnormals to 1e3, so every rounding
step is exercised; the stats must show the algorithm and a 16-bit wire ran."""
import os

import numpy as np

import gradflow as gf
from _hd_model import bytes_sent as hd_bytes_sent, halving_doubling
from _rd_model import bytes_sent, recursive_doubling
from _exact_checks import same_everywhere

ALGO = os.environ["GRADFLOW_ALLREDUCE_ALGO"]
if os.environ.get("WIRE_TEST_SCALAR_CODEC"):
    gf._native.set_codec_simd_enabled(False)
gf.init()
R, N = gf.rank(), gf.size()


def enc(x, wire):
    """float32 -> 16-bit pattern, round to nearest even (the codec's spec)."""
    x = np.asarray(x, np.float32)
    if wire == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    b = x.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)  # no NaNs in the inputs


def dec(h, wire):
    if wire == "fp16":
        return h.view(np.float16).astype(np.float32)
    return (h.astype(np.uint32) << 16).view(np.float32)


def segments(count):
    cnt = [count // N + (1 if k < count % N else 0) for k in range(N)]
    off = np.concatenate([[0], np.cumsum(cnt)]).astype(int)
    return [slice(off[k], off[k + 1]) for k in range(N)]


def model(xs, wire):
    """The documented result of ALGO on inputs xs[rank] (float32 arrays)."""
    if ALGO == "recursive-doubling":
        return recursive_doubling(xs, lambda v: dec(enc(v, wire), wire))
    if ALGO == "halving-doubling":
        return halving_doubling(xs, rnd=lambda v: dec(enc(v, wire), wire))
    out = np.empty_like(xs[0])
    for k, seg in enumerate(segments(xs[0].size)):
        if ALGO == "ring":
            # Segment k starts at rank k+1 and travels right; rank k (its
            # owner) adds its own value last.
            acc = enc(xs[(k + 1) % N][seg], wire)
            for hop in range(2, N + 1):
                p = (k + hop) % N
                acc = enc(xs[p][seg] + dec(acc, wire), wire)
        else:
            s = dec(enc(xs[0][seg], wire), wire)
            for p in range(1, N):
                s = s + dec(enc(xs[p][seg], wire), wire)  # float32 + float32: float32
            acc = enc(s, wire)
        out[seg] = dec(acc, wire)
    return out


def inputs(rank, count, seed):
    rng = np.random.default_rng(7919 * seed + rank)
    mag = 10.0 ** rng.uniform(-6, 3, count)  # fp16 subnormals (< 6.1e-5) up to 1e3
    return (rng.standard_normal(count) * mag).astype(np.float32)


def check(wire, count, op, seed):
    xs = [inputs(r, count, seed) for r in range(N)]
    comp = gf.Compression.fp16 if wire == "fp16" else gf.Compression.bf16
    name = f"wire.{wire}.{count}.{seed}"
    before = gf.stats()
    h = gf.allreduce_async(xs[R].copy(), op=op, name=name, compression=comp)
    got = h.wait()
    after = gf.stats()
    same_everywhere(got, name)
    want = model(xs, wire)
    if op == gf.Average:
        want = want * np.float32(1.0 / N)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (f"{name}: {bad.size} of {count} elements differ from the model of the "
                           f"{ALGO} rounding, e.g. index {bad[:5]}: got {got[bad[:5]]}, "
                           f"model {want[bad[:5]]}")
    assert not h.wire_overflow
    key = f"{ALGO}.{wire}"
    ran = after.get(f"allreduce.count.{key}", 0) - before.get(f"allreduce.count.{key}", 0)
    assert ran == 1, (f"{name}: allreduce.count.{key} went up by {ran}", after)
    # 16 bits on the wire: each rank sends about 2(N-1)/N of the buffer at 2 bytes.
    sent = after.get(f"bytes_sent.{key}", 0) - before.get(f"bytes_sent.{key}", 0)
    ideal = (bytes_sent(R, N, count * 2) if ALGO == "recursive-doubling"
             else hd_bytes_sent(R, N, count * 2, 2) if ALGO == "halving-doubling"
             else 2 * (N - 1) / N * count * 2)
    assert count < 1000 or 0.9 * ideal <= sent <= 1.1 * ideal, (name, sent, ideal)
    return got, xs


def rounding_is_exercised(got, xs, wire):
    """The inputs must make the documented model differ from both an exact
    sum and a single rounding of the fp32 sum (ring, N > 2): a wrong
    rounding scheme could not pass."""
    exact = sum(x.astype(np.float64) for x in xs)
    once = dec(enc(sum(x for x in xs), wire), wire)
    assert (got != exact.astype(np.float32)).mean() > 0.5, "inputs are exact in 16 bits"
    if ALGO == "ring" and N > 2:
        assert (got != once).mean() > 0.01, "ring model indistinguishable from one rounding"
    # The documented error bound, in units of the result's 16-bit spacing.
    eps = 2.0 ** -11 if wire == "fp16" else 2.0 ** -8
    hops = {"ring": N, "recursive-doubling": N.bit_length() + 1,
            "halving-doubling": N.bit_length() + 1}.get(ALGO, 1)  # roundings of partial sums
    bound = (hops * eps * sum(np.abs(x.astype(np.float64)) for x in xs)  # partial sums, inputs
             + N * eps * np.max([np.abs(x) for x in xs], axis=0) + 1e-7)
    err = np.abs(got - exact)
    assert (err <= bound).all(), np.max(err / bound)


for wire in ("fp16", "bf16"):
    # Odd sizes: uneven segments; 300_007 elements span several 64 KiB ring pieces.
    for seed, count in enumerate([1, N + 1, 4097, 300_007]):
        got, xs = check(wire, count, gf.Sum, seed)
    rounding_is_exercised(got, xs, wire)
    check(wire, 10_001, gf.Average, 9)
gf.barrier()
if R == 0:
    print(f"wire rounding OK on {N} ranks with {ALGO}", flush=True)
