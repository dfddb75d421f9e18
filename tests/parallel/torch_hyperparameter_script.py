# torch_hyperparameter_script.py — SPMD (test_torch.py, 2 and 3 ranks): the
# DistributedOptimizer's hyperparameter check (gradflow/torch/hyperparameter_check.py,
# native Note [Step tags]). Argument: the case.
#   equal: ranks whose rates agree raise nothing on the pool, copy, groups,
#     CSC and backward_passes_per_step=2 paths (a StepLR schedule moving the
#     rate), nor with a metric averaged before ReduceLROnPlateau, a
#     param-group key of the user's own that differs, join() with uneven
#     step counts, rates that differed before broadcast_optimizer_state,
#     or AMP GradScalers whose scales move alike; the weights end bitwise
#     identical.
#   plateau-<path> / transient-<path>: ReduceLROnPlateau stepped on each
#     rank's own loss, or one step with another rate on the last rank only:
#     with default timeouts every rank raises GradflowError within
#     CHECK_EVERY rounds of the difference, naming both ranks' values; the
#     job then ends non-zero (gradflow's fatal exit).
#   frozen-<path>: the last rank alone freezes a layer after wrapping: every
#     rank raises at the 16th round, naming it (before: its copy stayed put
#     while the others moved theirs, silently). "equal" freezes one on every
#     rank through tagged rounds: nothing raised.
#   steps-<path>: the last rank runs one backward pass more before a step():
#     its rounds pair with the others' rounds of the next step; every rank
#     raises at the 16th round, naming both step counts (before: weights
#     apart silently, and a stall at the end of training).
#   amp-<path> / ampseen-<path>: the last rank's GradScaler resumed with
#     another scale (2^10, the others 2^16), given as grad_scaler= (amp) or
#     not (ampseen: found stepping the optimizer): every rank raises at the
#     16th round naming both scales (before: weights apart after the first
#     step, silently). "equal" runs scalers that agree through growth and an
#     overflow on one rank: nothing raised.
#   passes-<path>: the last rank alone calls set_backward_passes_per_step(2)
#     and accumulates 2 passes per step: every rank raises at the 16th
#     round, naming both values (before, each reduction averaged one pass
#     with the sum of two, silently, until the other rank ran out of steps).
import sys
import time

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from gradflow.torch.hyperparameter_check import CHECK_EVERY
from _torch_common import assert_identical, batch, digits, mlp, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 8
CASE = sys.argv[1]
PATHS = {"pool": {}, "copy": {"use_pool": False}, "groups": {"groups": 2},
         "csc": {"sparse_ratio": 0.5}, "bpps2": {"backward_passes_per_step": 2}}


def wrapped(seed: int, name: str, path: str = "pool", grad_scaler=None, **sgd):
    m = mlp(seed=seed)
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), **sgd),
                                 named_parameters=[(f"{name}.{n}", p)
                                                   for n, p in m.named_parameters()],
                                 grad_scaler=grad_scaler, **PATHS[path])
    return m, o


def train_step(m, o, step, bpps=1):
    o.zero_grad()
    for k in range(bpps):
        xb, yb = batch(X, Y, bpps * step + k, R, N, PER)
        loss = F.cross_entropy(m(xb), yb)
        loss.backward()
    o.step()
    return loss.detach()


def run(steps, body):
    """Step index at which GradflowError came (None if none), and its message."""
    for step in range(steps):
        try:
            body(step)
        except hvd.GradflowError as e:
            return step, str(e)
    return None, ""


if CASE == "equal":
    for path in PATHS:
        m, o = wrapped(1, f"sched_{path}", path, lr=0.1, momentum=0.9, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.7)
        bpps = 2 if path == "bpps2" else 1
        at, msg = run(2 * CHECK_EVERY + 2, lambda step: (train_step(m, o, step, bpps), sched.step()))
        assert at is None, (path, msg)
        assert_identical(m.parameters(), f"StepLR on {path}")
    ok("rates moved alike by a schedule raise nothing on every path")

    m, o = wrapped(1, "averaged", lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
    at, msg = run(2 * CHECK_EVERY + 1, lambda step: sched.step(
        hvd.allreduce(train_step(m, o, step) * (1 + R * (step % 2)), name="val")))
    assert at is None, msg
    assert o.param_groups[0]["lr"] < 0.1  # the scheduler did move the rate
    assert_identical(m.parameters(), "averaged metric")
    ok("a metric averaged before ReduceLROnPlateau raises nothing")

    m, o = wrapped(3, "own_key", lr=0.1)
    o.param_groups[0]["my_rank"] = R
    at, msg = run(2 * CHECK_EVERY + 2, lambda step: train_step(m, o, step))
    assert at is None, msg
    assert_identical(m.parameters(), "own key")
    ok("a param-group key of the user's own is not compared")

    # Rates that differ for a few steps, then made equal by the broadcasts
    # (a late resume): the differences before the broadcast are forgiven.
    m, o = wrapped(5, "rebroadcast", lr=0.1 * (R + 1), momentum=0.9)
    run(3, lambda step: train_step(m, o, step))
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(o, root_rank=0)
    at, msg = run(2 * CHECK_EVERY, lambda step: train_step(m, o, step))
    assert at is None, msg
    assert o.param_groups[0]["lr"] == 0.1
    assert_identical(m.parameters(), "after broadcast_optimizer_state")
    ok("differences before broadcast_optimizer_state are forgiven")

    # join(), an epoch per join as in Horovod's examples: the last rank runs
    # out of data early (CHECK_EVERY + 3 steps in the first epoch, 5 in the
    # second); the others go on through tagged rounds meanwhile (joined ranks
    # submit nothing), and the next epoch's tagged rounds still line up.
    m, o = wrapped(4, "join", lr=0.1, momentum=0.9)
    for epoch, short in enumerate((CHECK_EVERY + 3, 5)):
        steps = 3 * CHECK_EVERY + 2 - (short if R == N - 1 else 0)
        at, msg = run(steps, lambda step: train_step(m, o, step))
        assert at is None, (epoch, msg)
        last = hvd.join()
        assert last in range(N), last
    ok("join() with uneven step counts, twice, raises nothing")

    # A layer frozen after wrapping on every rank (Note [Frozen after
    # wrapping]) through tagged rounds, then unfrozen: nothing raised.
    m, o = wrapped(6, "frozen_all", lr=0.1, momentum=0.9)

    def freeze_all(step):
        m[0].weight.requires_grad_(not 3 <= step < CHECK_EVERY + 5)
        train_step(m, o, step)

    at, msg = run(2 * CHECK_EVERY + 2, freeze_all)
    assert at is None, msg
    assert_identical(m.parameters(), "frozen on every rank")
    ok("a layer frozen after wrapping on every rank raises nothing")

    # AMP (Note [Loss scales agree]): scalers that agree raise nothing, given
    # as grad_scaler= or only stepping the optimizer, while the scale grows
    # (growth_interval=3) and backs off on an overflow seen on the last
    # rank only (its loss is inf at step 7: the reduced gradient is inf on
    # every rank, so every scaler skips that step and halves alike).
    for given in (True, False):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
        m, o = wrapped(7, f"amp_{given}", grad_scaler=scaler if given else None,
                       lr=0.1, momentum=0.9)
        scales = []

        def amp_step(step):
            o.zero_grad()
            xb, yb = batch(X, Y, step, R, N, PER)
            loss = F.cross_entropy(m(xb), yb) * (float("inf") if step == 7 and R == N - 1 else 1)
            scaler.scale(loss).backward()
            scaler.step(o)
            scaler.update()
            scales.append(scaler.get_scale())

        at, msg = run(2 * CHECK_EVERY + 2, amp_step)
        assert at is None, (given, msg)
        assert scales[6:8] == [4096.0, 2048.0] and scales[-1] > 2.0 ** 12, scales  # grew, backed off
        assert o._gradflow.seen_scaler is (None if given else scaler)
        assert_identical(m.parameters(), f"AMP, grad_scaler given: {given}")
    ok("GradScalers whose scales move alike raise nothing, given or not")
    sys.exit(0)

kind, path = CASE.split("-")
# amp / ampseen: the last rank's GradScaler resumed with another scale
# (2^10, the others 2^16), given as grad_scaler= or only stepping the optimizer
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (10 if R == N - 1 else 16))
m, o = wrapped(2, f"{kind}_{path}", path, grad_scaler=scaler if kind == "amp" else None,
               lr=0.1, momentum=0.9)
t0 = time.monotonic()
if kind.startswith("amp"):  # Note [Loss scales agree] (hyperparameter_check.py)
    def amp_step(step):
        o.zero_grad()
        xb, yb = batch(X, Y, step, R, N, PER)
        scaler.scale(F.cross_entropy(m(xb), yb)).backward()
        scaler.step(o)
        scaler.update()

    at, msg = run(3 * CHECK_EVERY, amp_step)
    assert at == CHECK_EVERY - 1, (at, msg)
    assert msg.count("now grad_scaler: scale=65536.0, growth_tracker=15,") + \
        msg.count("now grad_scaler: scale=1024.0, growth_tracker=15,") == 2, msg
    assert msg.count("; group 0: lr=0.1,") == 2, msg
elif kind == "plateau":
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
    at, msg = run(4 * CHECK_EVERY,
                  lambda step: sched.step(train_step(m, o, step) * (1 + R * (step % 2))))
    assert at is not None and at < 2 * CHECK_EVERY, (at, msg)
    assert "ReduceLROnPlateau" in msg, msg
elif kind == "passes":
    passes = 2 if R == N - 1 else 1
    o.set_backward_passes_per_step(passes)
    at, msg = run(3 * CHECK_EVERY, lambda step: train_step(m, o, step, passes))
    assert at == CHECK_EVERY - 1, (at, msg)
    assert "backward_passes_per_step=1" in msg and "backward_passes_per_step=2" in msg, msg
elif kind == "frozen":  # Note [Frozen on some ranks] (hyperparameter_check.py)
    def freeze_one(step):
        if step == 3 and R == N - 1:
            m[0].weight.requires_grad_(False)
        train_step(m, o, step)

    at, msg = run(3 * CHECK_EVERY, freeze_one)
    assert at == CHECK_EVERY - 1, (at, msg)
    assert "frozen=('frozen_pool.0.weight',)" in msg, msg
elif kind == "steps":  # Note [Steps per round]: one extra backward pass on the last rank
    def extra_pass(step):
        o.zero_grad()
        xb, yb = batch(X, Y, step, R, N, PER)
        for _ in range(2 if (step == 2 and R == N - 1) else 1):
            F.cross_entropy(m(xb), yb).backward()
        o.step()

    at, msg = run(3 * CHECK_EVERY, extra_pass)
    assert at == (CHECK_EVERY - 2 if R == N - 1 else CHECK_EVERY - 1), (at, msg)
    assert f"steps={CHECK_EVERY - 1}" in msg and f"steps={CHECK_EVERY - 2}" in msg, msg
else:
    def transient(step):
        for g in o.param_groups:  # the 5th step differs on the last rank only
            g["lr"] = 0.2 if (step == 4 and R == N - 1) else 0.1
        train_step(m, o, step)

    at, msg = run(3 * CHECK_EVERY, transient)
    assert at == CHECK_EVERY - 1, (at, msg)  # the 16th round carries the tag
took = time.monotonic() - t0
assert "the ranks' optimizer hyperparameters differ: rank 0 submitted allreduce" in msg, msg
assert f"but rank {N - 1} as part of {{hyperparameters #" in msg or kind == "plateau", msg
assert msg.count("now group 0: lr=") == 2 or kind.startswith("amp"), msg
assert took < 60, f"the error came after {took:.1f} s"
sys.stdout.write(f"{kind} on the {path} path raised on rank {R} of {N}\n")  # one write
sys.stdout.flush()
