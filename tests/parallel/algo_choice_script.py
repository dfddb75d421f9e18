"""Which allreduce algorithm really ran, from stats() (allreduce.count.<algo>.<wire>):
GRADFLOW_ALLREDUCE_ALGO=auto follows its documented table on both sides of
each threshold (two-sync up to 256 KiB when all ranks share a node, ring
above; across nodes recursive doubling up to 16 KiB, ring above), every
explicit choice is honoured for every dtype
and wire, and every rank made the same choice for every message."""
import os

import numpy as np

import gradflow as gf

ALGO = os.environ.get("GRADFLOW_ALLREDUCE_ALGO", "ring")
ONE_NODE = os.environ.get("EXPECT_ONE_NODE", "1") == "1"
gf.init()
R, N = gf.rank(), gf.size()
ALGOS = ["ring", "two-sync", "mpi", "recursive-doubling", "halving-doubling"]
LIMIT = 256 << 10  # the auto table's thresholds (README, "Configuration and tuning")
RD_LIMIT = 16 << 10


def expected(nbytes):
    if ALGO != "auto":
        return ALGO
    if ONE_NODE:
        return "two-sync" if nbytes <= LIMIT else "ring"
    return "recursive-doubling" if nbytes <= RD_LIMIT else "ring"


def ran(before, after, wire):
    """The algorithms whose counter for `wire` went up, with the increment."""
    out = {}
    for a in ALGOS:
        key = f"allreduce.count.{a}.{wire}"
        d = after.get(key, 0) - before.get(key, 0)
        if d:
            out[a] = d
    return out


choices = []
cases = []
for dtype in (np.float32, np.float64, np.float16):
    es = np.dtype(dtype).itemsize
    for count in (1, RD_LIMIT // es, RD_LIMIT // es + 1, LIMIT // es, LIMIT // es + 1, 4 * LIMIT // es):
        cases.append((dtype, count, None))
for wire in ("fp16", "bf16"):  # the table looks at the buffer's bytes, not the wire's
    for count in (RD_LIMIT // 4, RD_LIMIT // 4 + 1, LIMIT // 4, LIMIT // 4 + 1):
        cases.append((np.float32, count, wire))
for i, (dtype, count, wire) in enumerate(cases):
    x = np.full(count, R + 1, dtype)
    comp = {None: gf.Compression.none, "fp16": gf.Compression.fp16, "bf16": gf.Compression.bf16}[wire]
    before = gf.stats()
    got = gf.allreduce(x, op=gf.Sum, name=f"choice.{i}", compression=comp)
    after = gf.stats()
    assert (got == N * (N + 1) / 2).all(), (i, got[:4])
    what = ran(before, after, wire or "fp32")
    want = expected(count * np.dtype(dtype).itemsize) if N > 1 else None
    if N > 1:
        assert what == {want: 1}, (f"{np.dtype(dtype).name} x {count} wire {wire}: expected "
                                   f"{want} to run once, stats say {what}")
    choices.append(ALGOS.index(next(iter(what))) if what else -1)
# Every rank must have made every choice the same way.
allg = gf.allgather(np.array([choices], np.int64), name="choices")
assert (allg == allg[0]).all(), f"ranks chose different algorithms:\n{allg}"
gf.barrier()
if R == 0:
    print(f"algo choice OK on {N} ranks with {ALGO}: {[ALGOS[c] if c >= 0 else '-' for c in choices]}",
          flush=True)
