# torch_errors_script.py — SPMD: misuse of the torch binding must raise a
# clear GradflowError on every rank instead of hanging: step() twice without
# backward, too many backward passes, models that differ between ranks
# (DistributedOptimizer and broadcast_parameters), rank-dependent shapes.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import Branchy, batch, digits, expect_error, mlp, ok

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
# every rank alike) leaves its step unfinishable: later steps say so and name
# the cause (they used to advise raising backward_passes_per_step).


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
for step in (1, 2):
    expect_error(lambda: one_step(m, opt, step), "raised inside gradflow's reduction",
                 "RuntimeError: compress boom", "build a new DistributedOptimizer")
# Steps 1 and 2 raise without communicating: without this a rank could reach
# the end (shutdown) before a slower one submitted step 0's first gradient,
# which then failed with "shutdown() was called" (seen on a loaded machine).
hvd.barrier()
ok("a failed reduction names its cause at the next step")
