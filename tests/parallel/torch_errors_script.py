# torch_errors_script.py — SPMD: misuse of the torch binding must raise a
# clear GradflowError on every rank instead of hanging: step() twice without
# backward, step() without backward on one rank only, too many backward
# passes, models that differ between ranks (DistributedOptimizer and
# broadcast_parameters), rank-dependent shapes.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import (Branchy, assert_close, assert_identical, batch, digits,
                           expect_error, global_batch, mlp, ok)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()


def one_step(m, opt, step=0):
    opt.zero_grad()
    xb, yb = batch(X, Y, step, R, N, 8)
    F.cross_entropy(m(xb), yb).backward()
    opt.step()


# step() twice without backward (pool path built after the first step)
for use_pool in (True, False):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                   use_pool=use_pool)
    one_step(m, opt, 0)
    one_step(m, opt, 1)
    expect_error(opt.step, "called twice without backward")
    one_step(m, opt, 2)  # still usable afterwards
    ok(f"step twice raises (pool={use_pool})")

# more backward passes than backward_passes_per_step, with an op that is
# not idempotent: the first pass's reductions end when it returns (also with
# the unused head: it was the step's last pass, Note [Reduced when backward
# returns]), so a second pass before step() and zero_grad() would reduce
# reduced sums again: it raises on every rank.
m = Branchy()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                               op=hvd.Sum)
xb, yb = batch(X, Y, 0, R, N, 8)
F.cross_entropy(m(xb, use_extra=False), yb).backward()


def second_backward():
    F.cross_entropy(m(xb, use_extra=False), yb).backward()


expect_error(second_backward, "reduced twice", "backward_passes_per_step")
ok("too many backward passes with op=Sum raises")

# a model whose shapes differ on the last rank
wide = 32 if R < N - 1 else 33
torch.manual_seed(0)
bad = torch.nn.Sequential(torch.nn.Linear(64, wide), torch.nn.ReLU(), torch.nn.Linear(wide, 10))
expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(bad.parameters(), lr=0.1),
                                              bad.named_parameters()),
             "0.weight", f"rank {N - 1}", "same model")
expect_error(lambda: hvd.broadcast_parameters(bad.state_dict(), root_rank=0),
             "0.bias", f"rank {N - 1}")  # state_dict items are sorted
ok("mismatched model raises")

# the core's own signature check names the tensor
expect_error(lambda: hvd.allreduce(torch.zeros(3 + (R == N - 1)), name="grads.fc.weight"),
             "grads.fc.weight", "mismatched")
ok("rank-dependent allreduce shape raises")

# a backward pass that raised inside gradflow's reduction (a user Compressor,
# every rank alike) fails that step on every rank; after zero_grad() the next
# steps train (they used to raise "the step cannot be completed" for ever;
# Note [A failed step] in gradflow/torch/optimizer_step.py, whose own test is
# test_errors.py::test_a_failed_optimizer_step_fails_everywhere_and_training_goes_on).


class CompressOnceFails:
    calls = 0

    @staticmethod
    def compress(tensor):
        CompressOnceFails.calls += 1
        if CompressOnceFails.calls == 2:
            raise RuntimeError("compress boom")
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


m = mlp()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                               compression=CompressOnceFails, use_pool=False)
expect_error(lambda: one_step(m, opt, 0), "compress boom", exc=RuntimeError)
ref = mlp()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in (1, 2):
    one_step(m, opt, step)
    ref_opt.zero_grad()
    gx, gy = global_batch(X, Y, step, N, 8)
    F.cross_entropy(ref(gx), gy).backward()
    ref_opt.step()
assert_identical(list(m.parameters()), "after a failed step")
for p, q in zip(m.parameters(), ref.parameters()):
    assert_close(p.detach(), q.detach(), "after a failed step, against plain torch")
ok("a failed reduction fails its step only")

# Note [No backward on one rank]: the last rank calls step() without a
# backward (its loss skipped), at step 1 (layout agreement) and on the pool
# path; pool, copy path and CSC. Every rank's step fails at once with that
# rank's error (the others from their backward, whose end reduces), and
# after zero_grad() training goes on paired afresh: equal to plain torch
# with that step dropped. Before: that rank raised alone and the others
# waited for its buckets until GRADFLOW_TIMEOUT (a stall error after 60 s).
for kw in ({}, {"use_pool": False}, {"sparse_ratio": 0.5}):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                   **kw)
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        def skipping_step():
            opt.zero_grad()
            if R != N - 1:
                xb, yb = batch(X, Y, step, R, N, 8)
                F.cross_entropy(m(xb), yb).backward()
            opt.step()
        if step in (0, 2):
            expect_error(skipping_step, "no backward pass produced a gradient", f"rank {N - 1}"
                         if R != N - 1 else "called twice without backward")
            continue
        one_step(m, opt, step)
        ref_opt.zero_grad()
        gx, gy = global_batch(X, Y, step, N, 8)
        F.cross_entropy(ref(gx), gy).backward()
        ref_opt.step()
    assert_identical(list(m.parameters()), f"after a step without backward on one rank, {kw}")
    if not kw.get("sparse_ratio"):
        for p, q in zip(m.parameters(), ref.parameters()):
            assert_close(p.detach(), q.detach(), f"step without backward on one rank, {kw}")
    ok(f"a step without backward on one rank fails on every rank, then trains ({kw})")

# Note [Two live wrappers] (optimizer_setup.py): a second DistributedOptimizer
# over parameters a live one still reduces warns (both would reduce every
# gradient); none once the old one is dropped.
import warnings  # noqa: E402

m = mlp()
first = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
keeper = torch.optim.lr_scheduler.StepLR(first, 2)  # keeps the first one alive
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    second = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters()), m.named_parameters())
said = [str(w.message) for w in caught if "still alive" in str(w.message)]
assert len(said) == 1 and "wraps 4 parameter(s)" in said[0] and "'0.weight'" in said[0], said
del first, keeper, second
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    third = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters()), m.named_parameters())
assert not [w for w in caught if "still alive" in str(w.message)], [str(w.message) for w in caught]
ok("a second DistributedOptimizer over a live one's parameters warns")
