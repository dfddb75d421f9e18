# torch_optimizer_init_script.py — SPMD: broadcast_optimizer_state on a fresh
# optimizer initialises its state the way Horovod's does (one local step on
# zero gradients), so a Horovod script's numbers are reproduced: Adam's step
# count is 1 before the first real step, SGD's weight decay moves the weights
# once, p.grad is a zero tensor (not None). Checked against plain torch on
# one process doing the same by hand, then through two training steps.
import copy

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close, assert_identical, digits, global_batch, flat, mlp, ok, train

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER = 8

CASES = {
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "SGD momentum+wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1,
                                                  nesterov=True),
    "SGD stateless wd": lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.1),
}


def reference(make):
    """Plain torch, one process: Horovod's initialising step by hand, then
    two steps on the global batch (the average of the ranks' gradients)."""
    m = mlp(seed=7)
    o = make(m.parameters())
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    o.step()
    after_init = (flat(m.parameters()), copy.deepcopy(o.state_dict()))
    for step in range(2):
        o.zero_grad()
        xb, yb = global_batch(X, Y, step, N, PER)
        F.cross_entropy(m(xb), yb).backward()
        o.step()
    return after_init, flat(m.parameters())


for label, make in CASES.items():
    for wrap_first in (True, False):  # Horovod's order (wrap, then broadcast) and the reverse
        m = mlp(seed=7 + R)  # different weights per rank until broadcast_parameters
        o = make(m.parameters())
        if wrap_first:
            o = hvd.DistributedOptimizer(o, named_parameters=m.named_parameters())
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(o, root_rank=0)
        for p in m.parameters():
            assert p.grad is not None and not p.grad.any(), f"{label}: p.grad must be zeros"
        (ref_params, ref_state), ref_final = reference(make)
        assert_close(flat(m.parameters()), ref_params, f"{label}: weights after init", 1e-6)
        got = o.state_dict()["state"]
        assert set(got) == set(ref_state["state"]), label
        for k, st in ref_state["state"].items():
            for name, v in st.items():
                assert torch.equal(torch.as_tensor(got[k][name]), torch.as_tensor(v)), (label, name)
        if not wrap_first:
            o = hvd.DistributedOptimizer(o, named_parameters=m.named_parameters())
        train(m, o, 2, R, N, PER, x=X, y=Y)
        assert_identical(m.parameters(), label)
        assert_close(flat(m.parameters()), ref_final, f"{label}: after training", 1e-5)
    ok(f"broadcast_optimizer_state initialises a fresh {label} as Horovod")

# A rank whose state is not empty takes no initialising step; root's state wins.
m = mlp(seed=3)
o = torch.optim.Adam(m.parameters(), lr=0.01)
if R == 0:
    F.cross_entropy(m(X[:8]), Y[:8]).backward()
    o.step()
hvd.broadcast_optimizer_state(o, root_rank=0)
assert all(int(s["step"]) == 1 for s in o.state_dict()["state"].values())
ok("broadcast_optimizer_state: root's non-empty state wins")

# Horovod's resume recipe (checkpoint loaded on root only; also a worker
# joining an elastic job): root has state, the others are fresh. With weight
# decay the initialising step would move the fresh ranks' weights (Horovod
# leaves them decayed once, different from root's); here no rank takes it and
# every rank ends with root's weights and state, then trains in step with
# plain torch resumed from root's checkpoint. The reverse (root fresh, one
# other rank with state): root's initialised weights everywhere.
def adamw(ps):
    return torch.optim.AdamW(ps, lr=0.01, weight_decay=0.5)


for wrap_first in (True, False):
    ckpt_model = mlp(seed=11)
    o_ref = adamw(ckpt_model.parameters())
    F.cross_entropy(ckpt_model(X[:8]), Y[:8]).backward()
    o_ref.step()  # "the checkpoint": weights and AdamW state after one step
    ckpt = (copy.deepcopy(ckpt_model.state_dict()), copy.deepcopy(o_ref.state_dict()))
    m = mlp(seed=20 + R)
    o = adamw(m.parameters())
    if R == 0:
        m.load_state_dict(ckpt[0])
        o.load_state_dict(ckpt[1])
    if wrap_first:
        o = hvd.DistributedOptimizer(o, named_parameters=m.named_parameters())
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(o, root_rank=0)
    assert torch.equal(flat(m.parameters()), flat(ckpt_model.parameters())), \
        f"rank {R}: weights moved by the broadcast (wrap_first={wrap_first})"
    assert all(int(s["step"]) == 1 for s in o.state_dict()["state"].values())
    if not wrap_first:
        o = hvd.DistributedOptimizer(o, named_parameters=m.named_parameters())
    train(m, o, 2, R, N, PER, x=X, y=Y)
    train(ckpt_model, o_ref, 2, 0, 1, N * PER, x=X, y=Y)  # one process, the global batches
    assert_identical(m.parameters(), f"resume on root only (wrap_first={wrap_first})")
    assert_close(flat(m.parameters()), flat(ckpt_model.parameters()), "resume: after training", 1e-5)
ok("broadcast_optimizer_state: root's checkpoint with weight decay, fresh ranks keep root's weights")

m = mlp(seed=30 + R)
o = adamw(m.parameters())
if R == N - 1:  # only the last rank has state; root is fresh
    F.cross_entropy(m(X[:8]), Y[:8]).backward()
    o.step()
hvd.broadcast_parameters(m.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(o, root_rank=0)
ref = mlp(seed=30)
o_ref = adamw(ref.parameters())
for p in ref.parameters():
    p.grad = torch.zeros_like(p)
o_ref.step()  # root's initialising step: decays root's weights once
assert torch.equal(flat(m.parameters()), flat(ref.parameters())), f"rank {R}: not root's weights"
assert_identical(m.parameters(), "root fresh, another rank with state")
ok("broadcast_optimizer_state: root fresh, another rank with state: root's weights")
