# process_sets_broadcast_state_script.py — SPMD (test_process_sets.py), 3 or
# 4 ranks: sets A = [0, 1] and B = [2, ...] each train their own model with a
# DistributedOptimizer(process_set=) and sync it within the set, at the
# same time, with broadcast_parameters(..., process_set=) and
# broadcast_optimizer_state (the optimizer's own set by default; Note [State
# of a process set's model] in gradflow/torch/functions.py). Before, both
# ran on all ranks: the members alone stalled until GRADFLOW_TIMEOUT, and
# each set passing its own root failed on the mismatched roots, so a set's
# optimizer state could not be synced at all. Prints "OK" on every rank.
import time
import warnings

import torch

import gradflow.torch as hvd

warnings.simplefilter("ignore")
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
A, B = hvd.add_process_set([0, 1]), hvd.add_process_set(list(range(2, N)))
PS, ROOT = (A, 1) if R < 2 else (B, N - 1)  # a root other than the set's first rank
MEMBERS = PS.ranks


def build(kind):
    torch.manual_seed(100 + R)  # each rank its own weights
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    base = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
            if kind == "sgd" else torch.optim.AdamW(model.parameters(), lr=0.01))
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   process_set=PS)
    return model, opt


def flat_state(opt):
    out = []
    for st in opt.state_dict()["state"].values():
        out += [v.flatten().double() for v in st.values() if torch.is_tensor(v)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def set_values(t):
    """Every member's `t`, in set order."""
    return hvd.allgather_object(t, name="values", process_set=PS)


for kind in ("sgd", "adam"):
    # 1. state on every rank, each its own (momentum or moments per rank)
    model, opt = build(kind)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    with torch.no_grad():
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.is_floating_point() and v.dim():
                    v.add_(R + 1.0)
    t = time.time()
    hvd.broadcast_parameters(model.state_dict(), root_rank=ROOT, process_set=PS)
    hvd.broadcast_optimizer_state(opt, root_rank=ROOT)
    took = time.time() - t
    assert took < 5, f"rank {R}: the set's broadcasts took {took:.1f} s"
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    state = flat_state(opt)
    root_i = MEMBERS.index(ROOT)
    all_p, all_s = set_values(params), set_values(state)
    assert all(torch.equal(p, all_p[root_i]) for p in all_p), f"{kind}: parameters differ"
    assert all(torch.equal(s, all_s[root_i]) for s in all_s), f"{kind}: optimizer states differ"
    # the other set's model is its own: no value crossed between the sets
    every = hvd.allgather_object(params, name="all_params")
    assert not torch.equal(every[0], every[N - 1]), "set B received set A's parameters"
    # training goes on, the members bitwise alike
    for step in range(2):
        opt.zero_grad()
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step * 10 + R))
        model(x).pow(2).sum().backward()
        opt.step()
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(torch.equal(v, after) for v in set_values(after)), f"{kind}: set members differ"

    # 2. fresh optimizers everywhere (Horovod's initialising step on each member)
    model, opt = build(kind)
    hvd.broadcast_parameters(model.state_dict(), root_rank=ROOT, process_set=PS)
    hvd.broadcast_optimizer_state(opt, root_rank=ROOT)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(torch.equal(v, params) for v in set_values(params))
    assert all(torch.equal(v, flat_state(opt)) for v in set_values(flat_state(opt)))

    # 3. a root outside the set: every member raises ValueError at once
    outside = 2 if R < 2 else 0
    for call in (lambda: hvd.broadcast_optimizer_state(opt, root_rank=outside),
                 lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=outside,
                                                  process_set=PS)):
        t = time.time()
        try:
            call()
            raise AssertionError("a root outside the process set was accepted")
        except ValueError:
            assert time.time() - t < 5

# 4. a plain torch optimizer over a set, process_set= given
torch.manual_seed(100 + R)
lin = torch.nn.Linear(3, 3)
plain = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
lin(torch.ones(2, 3)).sum().backward()
plain.step()
with torch.no_grad():
    plain.state[lin.weight]["momentum_buffer"].fill_(float(R))
hvd.broadcast_optimizer_state(plain, root_rank=ROOT, process_set=PS)
assert float(plain.state[lin.weight]["momentum_buffer"][0, 0]) == float(ROOT)
hvd.barrier()
print("OK", flush=True)
hvd.shutdown()
