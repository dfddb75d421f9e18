# torch_late_params_script.py — SPMD: parameters that join a wrapped
# DistributedOptimizer after wrapping (Note [Late parameters] in
# gradflow/torch/optimizer.py): a frozen layer unfrozen for fine-tuning, a
# param group added with add_param_group(), and a group added while still
# frozen and unfrozen a step later. Each under every optimizer path (pool,
# copy path, groups=, accumulation, overlap=False, CSC) and, for the dense
# paths, checked against single-process training on the global batch (rank
# 0); parameters bitwise identical on every rank in all of them. Before the
# fix their gradients stayed local and the ranks silently drifted apart.
# Also a layer frozen after wrapping (Note [Frozen after wrapping]) for two
# steps, then unfrozen: it stays put while frozen, as in plain torch (before:
# a zero gradient, so momentum and weight decay moved it; max diff 0.14).
# Also (2026-11-29 audit) a parameter swapped in after wrapping (model and
# optimizer group both take a new nn.Parameter: Note [Parameters swapped in]
# in optimizer_state.py; before, its gradient stayed local and the ranks
# drifted apart on every path) and model.double() once the pools exist (Note
# [Pool views replaced]; before, the pool path reduced the pool's stale
# bytes and applied the local gradient: ranks apart; CSC raised torch's
# dtype error at zero_grad()).
import torch

import gradflow.torch as hvd
from _torch_common import (assert_close, assert_identical, digits, expect_error, flat, mlp, ok,
                           train)

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 12
PATHS = {
    "pool": {},
    "copy path": {"use_pool": False},
    "groups=2": {"groups": 2},
    "bpps=2": {"backward_passes_per_step": 2},
    "overlap=False": {"overlap": False},
    "csc 0.3": {"sparse_ratio": 0.3},
}


class ModelZeroGrad:
    """The loop's optimizer, but zero_grad() is model.zero_grad() (drops
    param.grad, pool views included)."""

    def __init__(self, opt, model):
        self.opt, self.model = opt, model

    def zero_grad(self):
        self.model.zero_grad()

    def step(self):
        self.opt.step()


def run(scenario: str, model, wrap, rank: int, size: int, per: int, bpps: int):
    """Six steps of `scenario` on `model`; `wrap(optimizer)` is the
    DistributedOptimizer (distributed) or the identity (reference)."""
    def steps(opt, start, count):
        train(model, opt, count, rank, size, per, bpps, start=start, x=X, y=Y)

    if scenario.startswith("freeze"):  # Note [Frozen after wrapping]: trainable at wrap time
        opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01))
        stepper = ModelZeroGrad(opt, model) if "model.zero_grad" in scenario else opt
        steps(stepper, 0, 2)
        for p in model[0].parameters():
            p.requires_grad_(False)
        before = flat(model[0].parameters())
        steps(stepper, 2, 2)
        # as plain torch: its gradient is None, momentum and decay leave it
        assert torch.equal(flat(model[0].parameters()), before), f"{scenario}: a frozen layer moved"
        for p in model[0].parameters():
            p.requires_grad_(True)
        steps(stepper, 4, 2)
    elif scenario == "unfreeze":  # frozen at wrap time, in the optimizer, unfrozen later
        model[0].weight.requires_grad_(False)
        opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        steps(opt, 0, 3)
        model[0].weight.requires_grad_(True)
        steps(opt, 3, 3)
    elif scenario == "swap a parameter":  # Note [Parameters swapped in]
        opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        steps(opt, 0, 2)
        old, new = model[2].weight, torch.nn.Parameter(model[2].weight.detach() * 0.5)
        model[2].weight = new
        opt.param_groups[0]["params"] = [new if q is old else q for q in opt.param_groups[0]["params"]]
        steps(opt, 2, 4)
    elif scenario == "model.double()":  # Note [Pool views replaced]: converted with the pools built
        opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        steps(opt, 0, 2)
        model.double()
        train(model, opt, 4, rank, size, per, bpps, start=2, x=X.double(), y=Y)
    else:  # the first layer joins through add_param_group
        for p in model[0].parameters():
            p.requires_grad_(False)
        opt = wrap(torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9))
        steps(opt, 0, 2)
        if scenario == "add_param_group":
            for p in model[0].parameters():
                p.requires_grad_(True)
            opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.05})
            steps(opt, 2, 4)
        else:  # "add frozen, unfreeze later": added while frozen, unfrozen a step later
            opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.05})
            steps(opt, 2, 1)
            for p in model[0].parameters():
                p.requires_grad_(True)
            steps(opt, 3, 3)
    return opt


for scenario in ("unfreeze", "add_param_group", "add frozen, unfreeze later",
                 "freeze, unfreeze later", "freeze, unfreeze later, model.zero_grad()",
                 "swap a parameter", "model.double()"):
    for path, kw in PATHS.items():
        bpps = kw.get("backward_passes_per_step", 1)
        m = mlp()
        w0 = m[0].weight.detach().clone()
        opt = run(scenario, m, lambda o: hvd.DistributedOptimizer(o, m.named_parameters(), **kw),
                  R, N, PER, bpps)
        name = f"{scenario}, {path}"
        assert not torch.equal(m[0].weight, w0), f"{name}: the late parameter never moved"
        assert_identical(m.parameters(), name)
        if R == 0 and "sparse_ratio" not in kw:
            ref = mlp()
            run(scenario, ref, lambda o: o, 0, 1, PER * N, bpps)
            assert_close(flat(m.parameters()), flat(ref.parameters()), name)
        ok(name)

# add_param_group is collective after wrapping: a different group on one
# rank raises on every rank, naming the tensor, instead of drifting apart.
if N > 1:
    m = mlp()
    for p in m[0].parameters():
        p.requires_grad_(False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m[2].parameters(), lr=0.1),
                                   m.named_parameters())
    m[0].weight.requires_grad_(True)
    late = [m[0].weight] if R != N - 1 else [m[0].weight, m[0].bias]
    m[0].bias.requires_grad_(R == N - 1)
    expect_error(lambda: opt.add_param_group({"params": late}), "add_param_group", "0.bias")
    ok("add_param_group differing between ranks raises everywhere")
hvd.shutdown()
