# torch_grad_before_step_script.py — SPMD: code that touches param.grad
# between backward() and step() without calling synchronize() first, as
# DDP users write it (Note [Reduced when backward returns] in
# gradflow/torch/optimizer.py): gradient clipping, PyTorch's plain AMP
# recipe (scaler.step(opt) unscales first), reading the gradient; also
# param.grad assigned by hand with no backward (torch.autograd.grad). Before the
# fix those ran while the core was still reducing in place, and the ranks'
# parameters silently drifted apart. Each case on the pool, copy, no-overlap,
# accumulation and CSC paths: bitwise identical on every rank, and for the
# dense fp32 paths equal to single-process training on the global batch.
import warnings

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import gradflow.torch as hvd
from _torch_common import (Branchy, assert_close, assert_identical, batch, digits, expect_error,
                           flat, mlp, ok, train)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 12
PATHS = {
    "pool": {},
    "copy path": {"use_pool": False},
    "overlap=False": {"overlap": False},
    "bpps=2": {"backward_passes_per_step": 2},
    "csc 0.3": {"sparse_ratio": 0.3},
    "fp16 wire": {"compression": hvd.Compression.fp16},
}


def clipped_training(model, opt, rank, size, per, bpps, steps=5):
    """zero_grad, backward(s), clip_grad_norm_, step: no synchronize()."""
    for step in range(steps):
        opt.zero_grad()
        for p in range(bpps):
            xb, yb = batch(X, Y, step * bpps + p, rank, size, per)
            F.cross_entropy(model(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        opt.step()


# 1. clip_grad_norm_ between backward and step
for path, kw in PATHS.items():
    bpps = kw.get("backward_passes_per_step", 1)
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   m.named_parameters(), **kw)
    clipped_training(m, opt, R, N, PER, bpps)
    assert_identical(m.parameters(), f"clip, {path}")
    if R == 0 and path in ("pool", "copy path", "overlap=False", "bpps=2"):
        ref = mlp()
        clipped_training(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), 0, 1,
                         PER * N, bpps)
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"clip, {path}")
    ok(f"clip_grad_norm_ before step, {path}")

# 2. after backward() returns, param.grad is the averaged gradient (as in DDP)
m = mlp()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
for step in range(3):
    opt.zero_grad()
    xb, yb = batch(X, Y, step, R, N, PER)
    F.cross_entropy(m(xb), yb).backward()
    if R == 0:
        ref = mlp()
        ref.load_state_dict(m.state_dict())
        xg, yg = batch(X, Y, step, 0, 1, PER * N)
        F.cross_entropy(ref(xg), yg).backward()
        assert_close(flat(p.grad for p in m.parameters()), flat(p.grad for p in ref.parameters()),
                     f"param.grad after backward, step {step}")
    opt.step()
ok("param.grad after backward is the average")

# 2b. two backward passes and one step with backward_passes_per_step=1: the
# first pass's reductions end when it returns, the second accumulates onto
# them and is reduced too; the step applies the sum of both averages, as
# plain torch applies the sum of both gradients.
def two_passes(model, opt, rank, size, per, steps=3):
    # plain torch's accumulation loop; the optimizer is told nothing of it
    train(model, opt, steps, rank, size, per, bpps=2, x=X, y=Y)


for path in ("pool", "copy path"):
    m = mlp()
    two_passes(m, hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                           m.named_parameters(), **PATHS[path]), R, N, PER)
    assert_identical(m.parameters(), f"two passes, {path}")
    if R == 0:
        ref = mlp()
        two_passes(ref, torch.optim.SGD(ref.parameters(), lr=0.1), 0, 1, PER * N)
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"two passes, {path}")
    ok(f"two backward passes per step with bpps=1, {path}")

# 2c. with op=Sum a second pass without zero_grad() would sum sums: it raises
# (clearly, on every rank); with opt.zero_grad() in between it is a new step.
m = mlp()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters(),
                               op=hvd.Sum)
xb, yb = batch(X, Y, 0, R, N, PER)
F.cross_entropy(m(xb), yb).backward()
expect_error(lambda: F.cross_entropy(m(xb), yb).backward(), "reduced twice", "zero_grad")
opt.zero_grad()
F.cross_entropy(m(xb), yb).backward()
opt.step()
if R == 0:
    ref = mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    for r in range(N):  # Sum of every rank's gradient
        F.cross_entropy(ref(batch(X, Y, 0, r, N, PER)[0]), batch(X, Y, 0, r, N, PER)[1]).backward()
    ref_opt.step()
    assert_close(flat(m.parameters()), flat(ref.parameters()), "op=Sum after zero_grad")
assert_identical(m.parameters(), "op=Sum")
ok("op=Sum: a second pass without zero_grad raises, with it a new step")

# 3. PyTorch's plain AMP recipe: scaler.step(opt) (unscale_ inside), an inf on
# rank 1 at step 2 makes every rank skip that step; model.zero_grad() or
# opt.zero_grad() between steps.
for path, kw in PATHS.items():
    if "backward_passes_per_step" in kw:
        continue
    for zero in ("opt", "model"):
        m = mlp()
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        grad_scaler = {"grad_scaler": scaler} if "sparse_ratio" in kw else {}
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                       m.named_parameters(), **kw, **grad_scaler)
        for step in range(5):
            (opt if zero == "opt" else m).zero_grad()
            xb, yb = batch(X, Y, step, R, N, PER)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(m(xb), yb)
            if step == 2 and R == min(1, N - 1):
                loss = loss * float("inf")
            before = flat(m.parameters())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            skipped = torch.equal(before, flat(m.parameters()))
            assert skipped == (step == 2), f"{path}: step {step}: skipped={skipped} on rank {R}"
            scales = hvd.allgather_object(scaler.get_scale())
            assert len(set(scales)) == 1, f"{path}: step {step}: scales differ {scales}"
            assert_identical(m.parameters(), f"amp, {path}, step {step}")
        ok(f"GradScaler.step without synchronize, {path}, {zero}.zero_grad")

# 4. Horovod's pattern still works as Horovod's: synchronize, unscale/clip,
# step inside skip_synchronize (no warning); step() after an explicit
# synchronize() without skip_synchronize warns, as Horovod does.
m = mlp()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())
for step in range(2):
    opt.zero_grad()
    xb, yb = batch(X, Y, step, R, N, PER)
    F.cross_entropy(m(xb), yb).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
opt.zero_grad()
xb, yb = batch(X, Y, 2, R, N, PER)
F.cross_entropy(m(xb), yb).backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
assert any("skip_synchronize" in str(w.message) for w in caught), [str(w.message) for w in caught]
assert_identical(m.parameters(), "horovod pattern")
ok("Horovod's synchronize / skip_synchronize pattern unchanged")

# 5. a model with unused parameters: `never` gets no gradient anywhere and
# `extra` only on some ranks and steps. The step is not complete when
# backward returns, but the step's last pass is: the reductions (zeros for
# the missing gradients, as DDP's find_unused_parameters) end there, so
# clipping without synchronize() sees the averaged gradients (before, it
# raced with the reduction and the ranks drifted apart).
def uses_extra(rank, step, p):
    return rank == 0 or (step + p) % 2 == 0


def branchy_clipped(model, opt, bpps, steps=5):
    for step in range(steps):
        opt.zero_grad()
        for p in range(bpps):
            xb, yb = batch(X, Y, step * bpps + p, R, N, PER)
            F.cross_entropy(model(xb, uses_extra(R, step, p)), yb).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        opt.step()


def branchy_reference(bpps, steps=5):
    """Every rank's gradient computed here (None -> zeros), averaged over
    ranks, summed over passes; then the same clip and SGD step."""
    ref = Branchy()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        total = [torch.zeros_like(q) for q in ref.parameters()]
        for p in range(bpps):
            for r in range(N):
                ref.zero_grad()
                xb, yb = batch(X, Y, step * bpps + p, r, N, PER)
                F.cross_entropy(ref(xb, uses_extra(r, step, p)), yb).backward()
                for t_, q in zip(total, ref.parameters()):
                    if q.grad is not None:
                        t_ += q.grad / N
        for q, t_ in zip(ref.parameters(), total):
            q.grad = t_
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.3)
        ref_opt.step()
    return ref


for path, kw in PATHS.items():
    bpps = kw.get("backward_passes_per_step", 1)
    m = Branchy()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   m.named_parameters(), **kw)
    branchy_clipped(m, opt, bpps)
    assert_identical(m.parameters(), f"unused parameters, clip, {path}")
    if R == 0 and path in ("pool", "copy path", "overlap=False", "bpps=2"):
        assert_close(flat(m.parameters()), flat(branchy_reference(bpps).parameters()),
                     f"unused parameters, clip, {path}")
    ok(f"unused parameters + clip_grad_norm_ before step, {path}")

# 5b. two passes over different parameters and one step (bpps=1): the first
# pass's reductions end when it returns (zeros for `extra`), the second
# starts a new step on top: the update equals plain torch's sum of both.
for path in ("pool", "copy path", "csc 0.3"):
    m = Branchy()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                   **PATHS[path])
    for step in range(3):
        opt.zero_grad()
        for p, extra in enumerate((False, True)):
            xb, yb = batch(X, Y, 2 * step + p, R, N, PER)
            F.cross_entropy(m(xb, extra), yb).backward()
        opt.step()
    assert_identical(m.parameters(), f"split passes, {path}")
    if R == 0 and path != "csc 0.3":
        ref = Branchy()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            ref_opt.zero_grad()
            for p, extra in enumerate((False, True)):
                xg, yg = batch(X, Y, 2 * step + p, 0, 1, PER * N)
                F.cross_entropy(ref(xg, extra), yg).backward()
            ref_opt.step()
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"split passes, {path}")
    ok(f"two passes over different parameters, bpps=1, {path}")

# 6. a reentrant backward (checkpoint(use_reentrant=True)) around the output
# layer: its end is not the end of the pass, so nothing is reduced there
# (op=Sum would raise "reduced twice" if it were); the outer pass's end is.
class Checkpointed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(64, 32)
        self.head = torch.nn.Linear(32, 10)
        self.never = torch.nn.Linear(3, 3)

    def forward(self, x, reentrant=True):
        return checkpoint(self.head, F.relu(self.body(x)), use_reentrant=reentrant)


for op in (hvd.Average, hvd.Sum):
    for path in ("pool", "copy path"):
        m = Checkpointed()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                       m.named_parameters(), op=op, **PATHS[path])
        ref = Checkpointed()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for step in range(3):
            opt.zero_grad()
            xb, yb = batch(X, Y, step, R, N, PER)
            F.cross_entropy(m(xb), yb).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
            ref_opt.zero_grad()  # every rank: the global batch (Sum: N x the mean)
            xg, yg = batch(X, Y, step, 0, 1, PER * N)
            (F.cross_entropy(ref(xg, False), yg) * (N if op == hvd.Sum else 1)).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            ref_opt.step()
        assert_identical(m.parameters(), f"checkpoint, {op}, {path}")
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"checkpoint, {op}, {path}",
                     1e-4)
        ok(f"reentrant checkpoint + unused parameter + clip, {op.name}, {path}")

# 7. closure optimizers (Note [Closures]): LBFGS calls step(closure) with no
# backward before it and runs the closure several times; each closure's
# backward is reduced when it returns and its loss is averaged over the
# ranks, so the line search and tolerance checks branch alike everywhere.
# Before: step() raised "no backward pass produced a gradient".
def lbfgs_run(model, opt, rank, size, per):
    xb, yb = batch(X, Y, 0, rank, size, per)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        return loss

    return [opt.step(closure).item() for _ in range(2)]


for path, search in (("pool", None), ("copy path", None), ("pool", "strong_wolfe")):
    m = mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=4, line_search_fn=search),
        m.named_parameters(), **PATHS[path])
    losses = lbfgs_run(m, opt, R, N, PER)
    assert_identical(m.parameters(), f"lbfgs, {path}, {search}")
    assert len(set(hvd.allgather_object(tuple(losses)))) == 1, "returned losses differ between ranks"
    ref = mlp()
    ref_losses = lbfgs_run(ref, torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=4,
                                                  line_search_fn=search), 0, 1, PER * N)
    # The strong-Wolfe search branches on loss comparisons, so the rounding
    # of a mean of per-rank means against the global mean can pick another
    # trial point: there only the first (pre-step) loss is compared.
    if search is None:
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"lbfgs, {path}", 1e-4)
    assert abs(losses[0] - ref_losses[0]) < 1e-5, (losses, ref_losses)
    ok(f"LBFGS step(closure), {path}, line search {search}")

# the classic closure with SGD: step(closure) after nothing
m = mlp()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                               m.named_parameters())
ref = mlp()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for step in range(3):
    xb, yb = batch(X, Y, step, R, N, PER)
    xg, yg = batch(X, Y, step, 0, 1, PER * N)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(m(xb), yb)
        loss.backward()
        return loss

    def ref_closure():
        ref_opt.zero_grad()
        loss = F.cross_entropy(ref(xg), yg)
        loss.backward()
        return loss

    opt.step(closure)
    ref_opt.step(ref_closure)
assert_identical(m.parameters(), "sgd closure")
assert_close(flat(m.parameters()), flat(ref.parameters()), "sgd closure")
ok("SGD step(closure)")

# 8. gradients assigned by hand (Note [Gradients assigned by hand]):
# param.grad set from torch.autograd.grad, no backward; on even steps every
# rank does so, on odd steps the last rank only (the others run backward:
# its whole step is submitted in step(), under the same names). Reduced as
# Horovod's synchronize() reduces them. Before: step() raised "no backward
# pass produced a gradient".
for path, kw in [*PATHS.items(), ("groups=2", {"groups": 2})]:
    if kw.get("backward_passes_per_step"):
        continue
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   m.named_parameters(), **kw)
    for step in range(4):
        opt.zero_grad()
        xb, yb = batch(X, Y, step, R, N, PER)
        loss = F.cross_entropy(m(xb), yb)
        if step % 2 == 0 or R == N - 1:
            for p, g in zip(m.parameters(), torch.autograd.grad(loss, list(m.parameters()))):
                p.grad = g
        else:
            loss.backward()
        opt.step()
    assert_identical(m.parameters(), f"gradients assigned by hand, {path}")
    if "csc" not in path:
        ref = mlp()
        train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), 4, 0, 1, PER * N)
        tol = 2e-3 if "fp16" in path else 1e-5
        assert_close(flat(m.parameters()), flat(ref.parameters()), f"assigned by hand, {path}",
                     tol)
    ok(f"gradients assigned by hand, {path}")
hvd.shutdown()
