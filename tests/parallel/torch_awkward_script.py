# torch_awkward_script.py — SPMD: DistributedOptimizer corner cases, each
# checked against single-process training on the concatenated batch (rank 0)
# and for bitwise-identical parameters: gradient accumulation, unused and
# frozen parameters, several param groups, shared (tied) parameters, sparse
# embedding gradients, two optimizers, model.zero_grad(), autocast+GradScaler.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import (Branchy, assert_close, assert_identical, batch, digits, flat, mlp, ok,
                           train)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 12


def sgd(params, **kw):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, **kw)


def compare(name, model, make, steps, bpps=1, tol=1e-5):
    """`model` (trained distributed) is identical everywhere and matches a
    fresh `make()` trained with plain SGD on the global batch (rank 0)."""
    assert_identical(model.parameters(), name)
    if R == 0:
        ref = make()
        train(ref, sgd(ref.parameters()), steps, 0, 1, PER * N, bpps, x=X, y=Y)
        assert_close(flat(model.parameters()), flat(ref.parameters()), name, tol)
    ok(name)


# 1. gradient accumulation, pool and copy paths
for use_pool in (True, False):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(),
                                   backward_passes_per_step=3, use_pool=use_pool)
    train(m, opt, 4, R, N, PER, bpps=3, x=X, y=Y)
    compare(f"accumulation bpps=3 pool={use_pool}", m, mlp, 4, bpps=3)


# 2. unused parameters: a head used only by rank 0 on some steps, one never used
for use_pool in (True, False):
    m = Branchy()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), use_pool=use_pool)
    for step in range(5):
        opt.zero_grad()
        xb, yb = batch(X, Y, step, R, N, PER)
        F.cross_entropy(m(xb, use_extra=R == 0 and step in (1, 3)), yb).backward()
        opt.step()
    assert_identical(m.parameters(), "unused")
    assert torch.equal(m.never.weight.grad, torch.zeros(3, 3)), "never-used grad must be zeros"
    ok(f"unused parameters pool={use_pool}")

# 3. frozen parameters are excluded and stay unchanged
m = mlp()
m[0].weight.requires_grad_(False)
w0 = m[0].weight.detach().clone()
opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
train(m, opt, 3, R, N, PER, x=X, y=Y)
assert torch.equal(m[0].weight, w0) and m[0].weight.grad is None


def frozen_mlp():
    r = mlp()
    r[0].weight.requires_grad_(False)
    return r


compare("frozen parameters", m, frozen_mlp, 3)

# 4. several param groups with different hyperparameters


def groups(model):
    return torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.05},
                            {"params": model[2].parameters(), "weight_decay": 0.01}],
                           lr=0.1, momentum=0.9)


m = mlp()
opt = hvd.DistributedOptimizer(groups(m), m.named_parameters())
train(m, opt, 4, R, N, PER, x=X, y=Y)
assert opt.param_groups[0]["lr"] == 0.05 and isinstance(opt, torch.optim.SGD)
if R == 0:
    ref = mlp()
    train(ref, groups(ref), 4, 0, 1, PER * N, x=X, y=Y)
    assert_close(flat(m.parameters()), flat(ref.parameters()), "param groups")
assert_identical(m.parameters(), "param groups")
ok("param groups")


# 5. shared (tied) parameters: one Linear applied twice
class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(64, 16)
        self.mid = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(torch.tanh(self.mid(torch.tanh(self.mid(h)))))


m = Tied()
opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
train(m, opt, 4, R, N, PER, x=X, y=Y)
compare("shared parameters", m, Tied, 4)


# 6. sparse embedding gradients (allgather path and sparse_as_dense)
class Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(17, 8, sparse=True)
        self.fc = torch.nn.Linear(64 * 8, 10)

    def forward(self, x):
        return self.fc(self.emb((x * 16).long()).flatten(1))


for as_dense in (False, True):
    m = Bag()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                   sparse_as_dense=as_dense)
    train(m, opt, 4, R, N, PER, x=X, y=Y)
    assert_identical(m.parameters(), "sparse")
    if R == 0:
        ref = Bag()
        train(ref, torch.optim.SGD(ref.parameters(), lr=0.1), 4, 0, 1, PER * N, x=X, y=Y)
        assert_close(flat(m.parameters()), flat(ref.parameters()), "sparse")
    ok(f"sparse embedding sparse_as_dense={as_dense}")


# 7. two DistributedOptimizers over different parameters, plus model.zero_grad()
def two_opt_loop(model, opts, steps, rank, size, per, bpps=1, x=None, y=None):
    for step in range(steps):
        model.zero_grad()  # set_to_none=True: drops the pool views; the hooks re-adopt them
        xb, yb = batch(x, y, step, rank, size, per)
        F.cross_entropy(model(xb), yb).backward()
        for o in opts:
            o.step()


m = mlp()
o1 = hvd.DistributedOptimizer(sgd(m[0].parameters()), m[0].named_parameters())
o2 = hvd.DistributedOptimizer(torch.optim.Adam(m[2].parameters(), lr=0.01), m[2].named_parameters())
two_opt_loop(m, [o1, o2], 4, R, N, PER, x=X, y=Y)
assert_identical(m.parameters(), "two optimizers")
if R == 0:
    ref = mlp()
    two_opt_loop(ref, [sgd(ref[0].parameters()), torch.optim.Adam(ref[2].parameters(), lr=0.01)],
                 4, 0, 1, PER * N, x=X, y=Y)
    assert_close(flat(m.parameters()), flat(ref.parameters()), "two optimizers", 1e-4)
ok("two optimizers + model.zero_grad()")

# 8. autocast(bfloat16) + GradScaler: rank 1 overflows on step 2; every rank must skip
m = mlp()
opt = hvd.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(5):
    opt.zero_grad()
    xb, yb = batch(X, Y, step, R, N, PER)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(xb), yb)
    if step == 2 and R == 1:
        loss = loss * float("inf")
    before = flat(m.parameters())
    scaler.scale(loss).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(m.parameters(), 5.0)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    scales = hvd.allgather_object(scaler.get_scale())
    assert len(set(scales)) == 1, f"step {step}: scales differ {scales}"
    skipped = torch.equal(before, flat(m.parameters()))
    assert skipped == (step == 2), f"step {step}: skipped={skipped} on rank {R}"
    assert_identical(m.parameters(), f"amp step {step}")
assert scaler.get_scale() < 1024.0
ok("autocast bf16 + GradScaler skip decision agrees")

# 9. broadcast_parameters / broadcast_optimizer_state restore rank 0's state
m = mlp(seed=R)  # different initial weights per rank
o = torch.optim.Adam(m.parameters(), lr=0.001 * (R + 1))
if R != 1:  # rank 1 keeps an empty optimizer state
    train(m, o, 2 + R, R, N, PER, x=X, y=Y)
hvd.broadcast_parameters(list(m.named_parameters()), root_rank=0)
hvd.broadcast_optimizer_state(o, root_rank=0)
assert_identical(m.parameters(), "broadcast_parameters")
sd = o.state_dict()
every = hvd.allgather_object((sd["param_groups"], {k: {n: v.tolist() if torch.is_tensor(v) else v
                                                      for n, v in s.items()}
                                                   for k, s in sd["state"].items()}))
assert all(e == every[0] for e in every), "optimizer state differs after broadcast"
assert o.param_groups[0]["lr"] == 0.001
opt = hvd.DistributedOptimizer(o, m.named_parameters())
train(m, opt, 2, R, N, PER, x=X, y=Y)
assert_identical(m.parameters(), "after broadcast_optimizer_state")
ok("broadcast_parameters / broadcast_optimizer_state")

# 10. an LR scheduler made *before* wrapping: torch patches the original
# optimizer's step (to count calls); the wrapper must still synchronize (it
# once ran the original class's step and skipped gradflow: ranks diverged)
# and the scheduler must still see the steps (no "lr_scheduler.step() before
# optimizer.step()" warning, the schedule advances).
import warnings  # noqa: E402

# Then the state is loaded into the wrapper (Horovod's recipe right after
# wrapping, broadcast_optimizer_state; a checkpoint restore): torch's
# load_state_dict makes new param_groups, so the scheduler, which holds the
# original optimizer, once changed groups the wrapper no longer used and the
# rate stopped following the schedule (silently; ranks still identical).
for use_pool, restore in ((True, None), (False, None), (True, "broadcast_optimizer_state"),
                          (False, "load_state_dict")):
    m = mlp()
    base = sgd(m.parameters())
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=2, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, m.named_parameters(), use_pool=use_pool)
    if restore == "broadcast_optimizer_state":
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    elif restore == "load_state_dict":
        opt.load_state_dict(opt.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # torch's order warning fails the case
        for step in range(4):
            train(m, opt, 1, R, N, PER, start=step, x=X, y=Y)
            sched.step()
    assert opt.param_groups[0]["lr"] == 0.1 * 0.5 ** 2, opt.param_groups[0]["lr"]
    assert base.param_groups is opt.param_groups and base.state is opt.state, restore
    assert_identical(m.parameters(), f"scheduler before wrapping pool={use_pool}")
    if R == 0:
        ref = mlp()
        ref_opt = sgd(ref.parameters())
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
        for step in range(4):
            train(ref, ref_opt, 1, 0, 1, PER * N, start=step, x=X, y=Y)
            ref_sched.step()
        assert_close(flat(m.parameters()), flat(ref.parameters()),
                     f"scheduler before wrapping pool={use_pool}", 1e-5)
    ok(f"LR scheduler made before wrapping pool={use_pool}, then {restore}")
