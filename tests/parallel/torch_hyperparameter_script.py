# torch_hyperparameter_script.py — SPMD (test_torch.py, 2 and 3 ranks): the
# DistributedOptimizer's hyperparameter check (gradflow/torch/hyperparameter_check.py).
# Ranks whose learning rates differ — ReduceLROnPlateau stepped on each
# rank's own loss, or one step with another rate on one rank only — raise
# GradflowError on every rank within CHECK_EVERY + 1 steps; equal rates
# (the metric averaged first), a key of the user's own that differs, and
# join() with uneven step counts raise nothing, and the weights stay
# bitwise identical. The runtime keeps working after the error.
import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from gradflow.torch.hyperparameter_check import CHECK_EVERY
from _torch_common import assert_identical, batch, digits, mlp, ok

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 8


def wrapped(seed: int, name: str, **sgd):
    m = mlp(seed=seed)
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), **sgd),
                                 named_parameters=[(f"{name}.{n}", p)
                                                   for n, p in m.named_parameters()])
    return m, o


def train_step(m, o, step):
    o.zero_grad()
    xb, yb = batch(X, Y, step, R, N, PER)
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


# 1. ReduceLROnPlateau on each rank's own loss: the rates part ways.
m, o = wrapped(1, "plateau", lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
at, msg = run(4 * CHECK_EVERY, lambda step: sched.step(train_step(m, o, step) * (1 + R * (step % 2))))
assert at is not None and at <= 2 * CHECK_EVERY + 1, (at, msg)
assert "the ranks' optimizer hyperparameters differed" in msg and "ReduceLROnPlateau" in msg, msg
assert "lr=" in msg, msg
ok("ReduceLROnPlateau on a rank-local metric raises on every rank")

# 2. The same with the metric averaged first: no error, identical weights.
m, o = wrapped(1, "averaged", lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
at, msg = run(3 * CHECK_EVERY, lambda step: sched.step(
    hvd.allreduce(train_step(m, o, step) * (1 + R * (step % 2)), name="val")))
assert at is None, msg
assert_identical(m.parameters(), "averaged metric")
ok("an averaged metric raises nothing")


# 3. One step (the 5th) with another rate on the last rank only, then equal
# again: still seen at the next comparison (the running CRC keeps it).
def transient(step):
    lr = 0.2 if (step == 4 and R == N - 1) else 0.1
    for g in o.param_groups:
        g["lr"] = lr
    train_step(m, o, step)


m, o = wrapped(2, "transient", lr=0.1)
at, msg = run(3 * CHECK_EVERY, transient)
assert at == CHECK_EVERY + 1, (at, msg)
ok("a one-step difference is seen at the next comparison")


# 4. A key of the user's own in a param group differs: not compared.
m, o = wrapped(3, "own_key", lr=0.1)
o.param_groups[0]["my_rank"] = R
at, msg = run(2 * CHECK_EVERY + 2, lambda step: train_step(m, o, step))
assert at is None, msg
assert_identical(m.parameters(), "own key")
ok("a param-group key of the user's own is not compared")


# 5. join(): the last rank runs out of data CHECK_EVERY steps early; the
# others go on through two comparisons with equal rates (joined ranks add
# zeros and are not counted).
m, o = wrapped(4, "join", lr=0.1, momentum=0.9)
steps = 3 * CHECK_EVERY + 2 - (CHECK_EVERY if R == N - 1 else 0)
at, msg = run(steps, lambda step: train_step(m, o, step))
assert at is None, msg
last = hvd.join()
assert last in range(N), last
ok("join() with uneven step counts raises nothing")
