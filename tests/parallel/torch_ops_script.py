# torch_ops_script.py — SPMD: every gradflow.torch tensor collective against a
# closed form in rank and index, in-place and async forms, dtypes (bfloat16,
# int, bool), non-contiguous inputs, autograd gradients, objects, barrier.
import torch

import gradflow
import gradflow.torch as hvd
from _torch_common import ok

hvd.init()
R, N = hvd.rank(), hvd.size()
S = N * (N + 1) / 2  # sum over ranks of (r + 1)


def val(rank, shape=(5, 3), dtype=torch.float32):
    return (torch.arange(torch.Size(shape).numel()).reshape(shape) % 7 + rank + 1).to(dtype)


def expected_sum(shape=(5, 3), dtype=torch.float32):
    return sum(val(r, shape, torch.float64) for r in range(N)).to(dtype)


# allreduce: out-of-place, in-place, async, ops, dtypes
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
    t = val(R, dtype=dtype)
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), expected_sum(dtype=dtype)), dtype
    assert torch.equal(t, val(R, dtype=dtype)), "allreduce must not modify its input"
avg = hvd.allreduce(val(R))
assert torch.allclose(avg, expected_sum() / N)
assert torch.equal(hvd.allreduce(val(R), op=hvd.Max), val(N - 1))
assert torch.equal(hvd.allreduce(val(R), op=hvd.Min), val(0))
assert torch.equal(hvd.allreduce(val(R), average=False), expected_sum())
t = val(R)
assert hvd.allreduce_(t, op=hvd.Sum) is t and torch.equal(t, expected_sum())
t = val(R)
h = hvd.allreduce_async_(t, op=hvd.Sum, name="inplace.async")
assert hvd.synchronize(h) is t and torch.equal(t, expected_sum()) and hvd.poll(h)
h = hvd.allreduce_async(val(R), name="outofplace.async", op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5)
assert torch.equal(hvd.synchronize(h), expected_sum())
nc = val(R, (3, 5)).t()  # non-contiguous, written back in place
assert not nc.is_contiguous()
hvd.allreduce_(nc, op=hvd.Sum)
assert torch.equal(nc, expected_sum((3, 5)).t())
scalar = hvd.allreduce(torch.tensor(float(R + 1)), op=hvd.Sum)
assert scalar.shape == () and scalar.item() == S
flags = hvd.allreduce(torch.tensor([R == 0, True]), op=hvd.Max)
assert flags.tolist() == [True, True]
fp16 = hvd.allreduce(val(R), op=hvd.Sum, compression=hvd.Compression.fp16)
assert torch.equal(fp16, expected_sum())  # small integers are exact in fp16
ok("allreduce")

# grouped allreduce (in place and not)
ts = [val(R, (k + 1, 2)) for k in range(4)]
outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
assert all(torch.equal(o, expected_sum((k + 1, 2))) for k, o in enumerate(outs))
hvd.grouped_allreduce_(ts, op=hvd.Sum)
assert all(torch.equal(o, expected_sum((k + 1, 2))) for k, o in enumerate(ts))
ok("grouped_allreduce")

# allgather with uneven first dimension, bf16
g = hvd.allgather(torch.full((R + 1, 2), float(R), dtype=torch.bfloat16))
assert g.dtype == torch.bfloat16 and g.shape == (S, 2)
assert g[:, 0].tolist() == [float(r) for r in range(N) for _ in range(r + 1)]
ok("allgather")

# broadcast
for root in range(N):
    t = val(R)
    assert torch.equal(hvd.broadcast(t, root), val(root)) and torch.equal(t, val(R))
    hvd.broadcast_(t, root)
    assert torch.equal(t, val(root))
ok("broadcast")

# alltoall: rank r sends (p + 1) rows of value r to rank p
splits = [p + 1 for p in range(N)]
x = torch.cat([torch.full((p + 1, 2), float(R)) for p in range(N)])
out, rsplits = hvd.alltoall(x, splits=splits)
assert rsplits.tolist() == [R + 1] * N
assert out[:, 0].tolist() == [float(s) for s in range(N) for _ in range(R + 1)]
even = hvd.alltoall(torch.full((N * 2,), float(R)))
assert even.tolist() == [float(s) for s in range(N) for _ in range(2)]
ok("alltoall")

# reducescatter
rs = hvd.reducescatter(val(R, (N * 2, 3)), op=hvd.Sum)
assert torch.equal(rs, expected_sum((N * 2, 3))[R * 2:(R + 1) * 2])
# compression=fp16/bf16: 1 + 2**-20 loses its low bits on a 16-bit wire, so
# the owner's block is its own exact value plus N - 1 peers' rounded ones
# (an uncompressed sum keeps every 2**-20), and half the bytes travel.
wide = torch.full((N * 64, 3), 1 + 2 ** -20)
sent = {}
for c in (hvd.Compression.none, hvd.Compression.fp16, hvd.Compression.bf16):
    before = gradflow.stats().get("bytes_sent", 0.0)
    got = hvd.reducescatter(wide, op=hvd.Sum, compression=c)
    sent[c] = gradflow.stats().get("bytes_sent", 0.0) - before
    exact = N * (1 + 2 ** -20) if c is hvd.Compression.none else N + 2 ** -20
    assert got.dtype == torch.float32 and torch.equal(got, torch.full((64, 3), exact)), (c, got[0])
if N > 1:  # one rank sends nothing
    assert sent[hvd.Compression.fp16] * 2 == sent[hvd.Compression.none] > 0, sent
    assert sent[hvd.Compression.bf16] == sent[hvd.Compression.fp16], sent
pair = hvd.grouped_reducescatter([wide, 2 * wide], op=hvd.Sum, compression=hvd.Compression.fp16)
assert torch.equal(pair[0], torch.full((64, 3), N + 2 ** -20)), pair[0][0]
assert torch.equal(pair[1], torch.full((64, 3), 2 * N + 2 ** -19)), pair[1][0]


class Halver:
    """A user Compressor (Horovod's interface): runs around the collective."""
    calls = []

    @staticmethod
    def compress(t):
        Halver.calls.append("compress")
        return t / 2, "ctx"

    @staticmethod
    def decompress(t, ctx):
        Halver.calls.append("decompress:" + ctx)
        return t * 2


got = hvd.reducescatter(val(R, (N * 2, 3)), op=hvd.Sum, compression=Halver)
assert torch.equal(got, expected_sum((N * 2, 3))[R * 2:(R + 1) * 2]) and \
    Halver.calls == ["compress", "decompress:ctx"], Halver.calls
got = hvd.grouped_reducescatter([val(R, (N, 2))] * 2, op=hvd.Sum, compression=Halver)
assert all(torch.equal(g, expected_sum((N, 2))[R:R + 1]) for g in got) and len(Halver.calls) == 6
x = torch.ones(N * 2, 2, requires_grad=True)  # the gradient travels uncompressed, as in Horovod
hvd.reducescatter(x * (1 + 2 ** -20), op=hvd.Sum, compression=hvd.Compression.fp16).sum().backward()
assert torch.equal(x.grad, torch.full((N * 2, 2), 1 + 2 ** -20)), x.grad
ok("reducescatter")

# autograd
x = torch.ones(4, requires_grad=True)
hvd.allreduce(x * (R + 1), op=hvd.Sum).sum().backward()
assert torch.equal(x.grad, torch.full((4,), float(N * (R + 1)))), x.grad
x = torch.ones(4, requires_grad=True)
hvd.allreduce(x * (R + 1)).sum().backward()  # average: d/dx = (r+1) * mean of ones
assert torch.allclose(x.grad, torch.full((4,), float(R + 1))), x.grad
x = torch.ones(R + 1, 2, requires_grad=True)
w = torch.arange(S * 2, dtype=torch.float32).reshape(-1, 2)
(hvd.allgather(x) * w).sum().backward()  # grad = mean over ranks of w, this rank's rows
off = R * (R + 1) // 2
assert torch.equal(x.grad, w[off:off + R + 1]), x.grad
x = torch.ones(3, requires_grad=True)
(hvd.broadcast(x, 0) * 2).sum().backward()
assert torch.equal(x.grad, torch.full((3,), 2.0 if R == 0 else 0.0)), x.grad
ts = [torch.ones(2, requires_grad=True) for _ in range(2)]
sum(o.sum() for o in hvd.grouped_allreduce(ts, op=hvd.Sum)).backward()
assert all(torch.equal(t.grad, torch.full((2,), float(N))) for t in ts)
x = torch.ones(N * 2, 2, requires_grad=True)
hvd.reducescatter(x, op=hvd.Sum).sum().backward()
assert torch.equal(x.grad, torch.ones(N * 2, 2)), x.grad
ok("autograd")

# objects
assert hvd.broadcast_object({"r": R, "s": "x" * R}, root_rank=N - 1) == {"r": N - 1, "s": "x" * (N - 1)}
assert hvd.allgather_object(("rank", R)) == [("rank", r) for r in range(N)]
sd = {"a": torch.full((2,), float(R)), "b": torch.tensor(R)}
hvd.broadcast_parameters(sd, root_rank=0)
assert sd["a"].tolist() == [0.0, 0.0] and sd["b"].item() == 0
ok("objects")

# barrier, join (every rank at once, nothing pending) and topology
hvd.barrier()
last = hvd.join()
assert hvd.allgather_object(last) == [last] * N and 0 <= last < N, last
assert hvd.is_initialized() and hvd.local_size() >= 1 and hvd.cross_size() >= 1
ok("barrier")
