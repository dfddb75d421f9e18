# torch_ops_script.py — SPMD: every gradflow.torch tensor collective against a
# closed form in rank and index, in-place and async forms, dtypes (bfloat16,
# int, bool), non-contiguous inputs, autograd gradients and version counters,
# aliasing in-place inputs, objects (and unpicklable ones), barrier.
import threading
import time

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

# in-place collectives move the autograd version counter, as torch's own
# in-place ops do: a backward that saved the tensor raises instead of using
# the reduced values (it silently used them: d(y*y)/dx came out 2*S, not 2*(R+1))
def saved_then(write, shape=(3,), view=lambda y: y):
    x = torch.full(shape, float(R + 1), requires_grad=True)
    y = view(x * 1.0)
    z = (y * y).sum()  # saves y
    before = y._version
    result = write(y)
    assert y._version > before, (y._version, before)
    assert torch.equal(y, torch.full_like(y, result)), y  # the collective's own values
    try:
        z.backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e), e
    else:
        raise AssertionError(f"backward used the in-place result: grad {x.grad}")


saved_then(lambda y: hvd.allreduce_(y, op=hvd.Sum) is y and S)
saved_then(lambda y: hvd.allreduce_(y, op=hvd.Sum) is y and S, (3, 2), lambda y: y.t())
saved_then(lambda y: hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum)) is y and S)
saved_then(lambda y: hvd.allreduce_(y) is y and S / N)  # average: the core scales in place
saved_then(lambda y: hvd.broadcast_(y, N - 1) is y and N)
saved_then(lambda y: hvd.grouped_allreduce_([y], op=hvd.Sum)[0] is y and S)
saved_then(lambda y: hvd.synchronize(hvd.grouped_allreduce_async_([y], op=hvd.Sum))[0] is y and S)
y = torch.full((3,), float(R + 1))
h = hvd.allreduce_async_(y, op=hvd.Sum, name="version.inflight")
assert y._version == 1, y._version  # moved at submit, while the core may write
hvd.synchronize(h)
assert y._version == 2 and torch.equal(y, torch.full((3,), S)), (y._version, y)
# nothing saved the written tensor: backward runs, gradient in closed form
x = torch.full((3,), float(R + 1), requires_grad=True)
y = x * 2.0  # saves no tensor
hvd.allreduce_(y, op=hvd.Sum)
(y * 3.0).sum().backward()
assert torch.equal(x.grad, torch.full((3,), 6.0)) and torch.equal(y, torch.full((3,), 2 * S))
with torch.inference_mode():  # inference tensors have no version counter
    t = torch.full((3,), float(R + 1))
    assert torch.equal(hvd.allreduce_(t, op=hvd.Sum), torch.full((3,), S))
ok("in-place version counter")

# grouped_allreduce_ refuses tensors that share memory, on every rank alike,
# before submitting anything (it returned values reduced once or twice
# depending on size); interleaved views that share no byte are fine; the
# out-of-place form takes the same tensor twice.
base = torch.full((8,), float(R + 1))
for bad, says in [([base, base], "are the same tensor"),
                  ([base[:5], base[3:]], "share memory"),
                  ([base, base.view(2, 4)], "share memory"),
                  ([base[0::2], base[2:]], "share memory"),
                  ([torch.ones(2), base[1:3], base[2:4]], "tensors 1 and 2"),
                  ([base[4:], base.view(torch.int32)[:1], base[:4]], "tensors 1 and 2")]:
    for call in (hvd.grouped_allreduce_,
                 lambda ts, **kw: hvd.synchronize(hvd.grouped_allreduce_async_(ts, **kw))):
        try:
            call(bad, op=hvd.Sum)
        except ValueError as e:
            assert says in str(e) and "grouped_allreduce_" in str(e), e
        else:
            raise AssertionError(f"aliasing not refused: {bad}")
        assert torch.equal(base, torch.full((8,), float(R + 1))), base  # nothing written
hvd.grouped_allreduce_([base[0::2], base[1::2]], op=hvd.Sum)
assert torch.equal(base, torch.full((8,), S)), base
big = torch.full((9_000_000,), float(R + 1))  # 2 x 36 MB: past the 64 MiB fusion threshold
for n, t in ((5, torch.full((5,), float(R + 1))), (big.numel(), big)):
    a, b = hvd.grouped_allreduce([t, t], op=hvd.Sum)
    assert torch.equal(a, torch.full((n,), S)) and torch.equal(b, a), (n, a[:3], b[:3])
    assert torch.equal(t, torch.full((n,), float(R + 1)))  # input untouched
x = torch.ones(3, requires_grad=True)
a, b = hvd.grouped_allreduce([x, x], op=hvd.Sum)
(a + 2 * b).sum().backward()
assert torch.equal(x.grad, torch.full((3,), 3.0 * N)), x.grad
assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(N)))
ok("grouped_allreduce_ aliasing")

# allgather with uneven first dimension, bf16
g = hvd.allgather(torch.full((R + 1, 2), float(R), dtype=torch.bfloat16))
assert g.dtype == torch.bfloat16 and g.shape == (S, 2)
assert g[:, 0].tolist() == [float(r) for r in range(N) for _ in range(r + 1)]
ok("allgather")

# empty results, every dtype: an allgather of 0 rows in all, an alltoall that
# sends a rank nothing, a reducescatter with fewer rows than ranks, a sparse
# allreduce with no entry on any rank (a sparse embedding no rank used this
# step). They raised "must be 1 to view Byte as Float" after the collective.
for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
           torch.float16, torch.bfloat16, torch.float32, torch.float64):
    g = hvd.allgather(torch.zeros(0, 3, dtype=dt), name=f"empty.allgather.{dt}")
    assert g.shape == (0, 3) and g.dtype == dt, (g.shape, g.dtype)
    # rank 0 sends its 2 rows to rank 0; nobody sends anything to the others
    x = torch.ones(2 if R == 0 else 0, 3, dtype=dt)
    got, rsplits = hvd.alltoall(x, splits=[x.shape[0]] + [0] * (N - 1), name=f"empty.a2a.{dt}")
    assert got.dtype == dt and got.shape == ((2, 3) if R == 0 else (0, 3)), got.shape
    assert rsplits.tolist() == ([2] + [0] * (N - 1) if R == 0 else [0] * N)
    if dt not in (torch.bool, torch.uint8):
        rs = hvd.reducescatter(torch.ones(1, 3, dtype=dt), op=hvd.Sum, name=f"empty.rs.{dt}")
        assert rs.dtype == dt and rs.shape == ((1, 3) if R == 0 else (0, 3)), rs.shape
        if R == 0:
            assert rs.tolist() == [[N] * 3], rs
none = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (4, 5))
summed = hvd.sparse_allreduce_async(none, name="empty.sparse", op=hvd.Sum).wait()
assert summed.shape == (4, 5) and summed.to_dense().abs().sum() == 0
ok("empty results")

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

# an object that cannot be pickled (root's, or one rank's in allgather_object):
# every rank raises at once, quoting the pickling error (only the pickling
# rank raised; the others stalled in '<name>.size' for GRADFLOW_TIMEOUT), and
# the runtime stays usable
t0 = time.time()
try:
    hvd.broadcast_object(threading.Lock() if R == N - 1 else None, root_rank=N - 1, name="cfg")
except (TypeError, gradflow.GradflowError) as e:
    assert isinstance(e, TypeError if R == N - 1 else gradflow.GradflowError), repr(e)
    assert "cannot pickle" in str(e) and "_thread.lock" in str(e), e
    if R != N - 1:
        assert f"root rank {N - 1}" in str(e) and "'cfg'" in str(e), e
else:
    raise AssertionError("broadcast_object of a lock did not raise")
try:
    hvd.allgather_object(threading.Lock() if R == 0 else R)
except (TypeError, gradflow.GradflowError) as e:
    assert isinstance(e, TypeError if R == 0 else gradflow.GradflowError), repr(e)
    assert "cannot pickle" in str(e), e
    if R != 0:
        assert "rank(s) 0 could not pickle" in str(e), e
else:
    raise AssertionError("allgather_object of a lock did not raise")
assert time.time() - t0 < 20, time.time() - t0  # GRADFLOW_TIMEOUT is 60 s
assert hvd.broadcast_object({"r": R}, root_rank=0) == {"r": 0}
assert hvd.allgather_object(R * R) == [r * r for r in range(N)]
ok("unpicklable objects")

# barrier, join (every rank at once, nothing pending) and topology
hvd.barrier()
last = hvd.join()
assert hvd.allgather_object(last) == [last] * N and 0 <= last < N, last
assert hvd.is_initialized() and hvd.local_size() >= 1 and hvd.cross_size() >= 1
ok("barrier")
