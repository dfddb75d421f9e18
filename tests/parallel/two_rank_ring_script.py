"""Run by test_multihost.py on 2 emulated hosts, one rank each, MPICH over
libfabric tcp: the two-rank ring with many pieces in flight (Note [Receives
before send waits], native/ring_allreduce.cc). Out of place (numpy), in place
(torch allreduce_), and on the 16-bit wire with its staging; every result
bit for bit against a numpy model, identical on both ranks, several rounds
so the allgather pieces keep overtaking the reduce-scatter."""
import numpy as np
import torch

import gradflow as gf
import gradflow.torch as gft

gf.init()
R, N = gf.rank(), gf.size()
assert N == 2, N
COUNT = 4 << 20  # 16 MiB of float32: 32 pieces of 256 KiB per segment
HALF = COUNT // 2  # segment k is owned by rank k


def inputs(round_):
    rng = np.random.default_rng(1000 + round_)
    xs = [rng.uniform(-4, 4, COUNT).astype(np.float32) for _ in range(N)]
    return xs


def wire_model(xs):
    # Rank k owns segment k: it adds the peer's fp16 image to its own fp32
    # values, then the sum goes out as fp16 and everyone keeps decode(encode).
    out = np.empty(COUNT, np.float32)
    for k in range(N):
        seg = slice(k * HALF, (k + 1) * HALF)
        s = xs[k][seg] + xs[1 - k][seg].astype(np.float16).astype(np.float32)
        out[seg] = s.astype(np.float16).astype(np.float32)
    return out


def same_on_both(y, what):
    got = gf.allgather(y.reshape(1, -1).view(np.int32), name=f"check.{what}")
    assert np.array_equal(got[0], got[1]), f"{what}: ranks differ"


for round_ in range(4):
    xs = inputs(round_)
    exact = xs[0] + xs[1]  # two operands: the sum is the same in either order
    y = gf.allreduce(xs[R], op=gf.Sum, name=f"oop.{round_}")
    assert np.array_equal(y, exact), f"out of place, round {round_}"
    t = torch.from_numpy(xs[R].copy())
    gft.allreduce_(t, op=gf.Sum, name=f"inplace.{round_}")
    assert np.array_equal(t.numpy(), exact), f"in place, round {round_}"
    w = gf.allreduce(xs[R], op=gf.Sum, name=f"fp16.{round_}", compression=gf.Compression.fp16)
    assert np.array_equal(w, wire_model(xs)), f"fp16 wire, round {round_}"
    same_on_both(w, f"fp16.{round_}")
    tw = torch.from_numpy(xs[R].copy())
    gft.allreduce_(tw, op=gf.Sum, name=f"inplace.fp16.{round_}", compression=gf.Compression.fp16)
    assert np.array_equal(tw.numpy(), wire_model(xs)), f"in-place fp16 wire, round {round_}"
st = gf.stats()
assert st.get("allreduce.count.ring.fp32", 0) == 8 and st.get("allreduce.count.ring.fp16", 0) == 8, st
if R == 0:
    print("two-rank ring OK", flush=True)
gf.shutdown()
