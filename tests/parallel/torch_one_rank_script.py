# torch_one_rank_script.py — one rank (Note [One rank], gradflow/torch/optimizer.py):
# DistributedOptimizer in every mode trains bit for bit like the plain torch
# optimizer and sends nothing through the core; the step-protocol errors,
# sparse_as_dense and a user Compressor behave as on N ranks.
import torch
import torch.nn.functional as F

import gradflow
import gradflow.torch as hvd
from _torch_common import Branchy, digits, expect_error, mlp, ok, train

hvd.init()
assert hvd.size() == 1, "run with one rank"
X, Y = digits()
PER, STEPS = 32, 6


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def allreduces() -> float:
    return gradflow.stats().get("allreduce.count", 0.0)


# 1. every mode == plain torch, bit for bit, with no collective submitted
MODES = {
    "pool": {}, "copy": dict(use_pool=False), "fp16 wire": dict(compression=hvd.Compression.fp16),
    "bf16 wire": dict(compression=hvd.Compression.bf16), "csc 0.01": dict(sparse_ratio=0.01),
    "all (fp16 + csc 0.01)": dict(compression=hvd.Compression.fp16, sparse_ratio=0.01),
    "predivide 3": dict(gradient_predivide_factor=3.0), "op Sum": dict(op=hvd.Sum),
    "op Adasum": dict(op=hvd.Adasum), "groups 2": dict(groups=2),
    "2 passes per step": dict(backward_passes_per_step=2),
}
for what, kw in MODES.items():
    bpps = kw.get("backward_passes_per_step", 1)
    ref = mlp(1)
    train(ref, sgd(ref), STEPS, 0, 1, PER, bpps=bpps, x=X, y=Y)
    model = mlp(1)
    opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters(), **kw)
    before = allreduces()
    train(model, opt, STEPS, 0, 1, PER, bpps=bpps, x=X, y=Y)
    assert allreduces() == before, f"{what}: one rank submitted allreduces"
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b), f"{what}: differs from plain torch"
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters()), f"{what}: zero_grad kept gradients"
    assert not opt.wire_overflow
ok("every mode equals plain torch bit for bit, nothing sent")

# 2. the step protocol's errors still raise. (After the second pass the
# step is reduced, unused head or not; with op=Sum a third pass before
# step() raises, Note [Reduced when backward returns].)
model = Branchy()
opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters(), backward_passes_per_step=2,
                               op=hvd.Sum)
expect_error(opt.step, "no backward pass produced a gradient")
for _ in range(2):
    F.cross_entropy(model(X[:8], use_extra=False), Y[:8]).backward()
expect_error(lambda: F.cross_entropy(model(X[:8], use_extra=False), Y[:8]).backward(),
             "reduced twice", "backward_passes_per_step")
ok("step without backward and extra passes raise")

# 3. sparse gradients: plain torch's sparse gradient, or dense with sparse_as_dense
for dense in (False, True):
    torch.manual_seed(4)
    emb = torch.nn.Embedding(50, 4, sparse=True)
    ref = torch.nn.Embedding(50, 4, sparse=True)
    ref.load_state_dict(emb.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                   emb.named_parameters(), sparse_as_dense=dense)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    idx = torch.tensor([1, 7, 7, 30])
    for m, o in ((emb, opt), (ref, ref_opt)):
        o.zero_grad()
        m(idx).sum().backward()
    opt.synchronize()
    assert emb.weight.grad.is_sparse != dense, "sparse_as_dense not honoured"
    with opt.skip_synchronize():
        opt.step()
    ref_opt.step()
    assert torch.equal(emb.weight, ref.weight), "sparse gradient step differs from plain torch"
ok("sparse gradients and sparse_as_dense")


# 4. a user Compressor keeps the normal path (its round trip may be lossy on purpose)
class Halve(hvd.Compressor):
    calls = 0

    @staticmethod
    def compress(tensor):
        Halve.calls += 1
        return tensor * 0.5, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor * 2.0


model, ref = mlp(5), mlp(5)
opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters(), compression=Halve)
assert not opt._gradflow.solo
train(model, opt, 2, 0, 1, PER, x=X, y=Y)
train(ref, sgd(ref), 2, 0, 1, PER, x=X, y=Y)
assert Halve.calls > 0, "user Compressor not called"
for a, b in zip(model.parameters(), ref.parameters()):
    assert torch.allclose(a, b, atol=1e-6), "user Compressor path differs from plain torch"
ok("a user Compressor still runs")
hvd.shutdown()
