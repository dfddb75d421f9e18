"""join() with the torch DistributedOptimizer: ranks run out of data at
different steps (rank 0 last on 2 ranks) and join while the others keep
training; joined ranks contribute zero gradients (the average still divides
by size, as in Horovod). After the last join, parameters broadcast from the
rank join() returns are identical everywhere and equal a single-process
reference that averages the active ranks' gradients over size.

Then sparse embedding gradients (Note [Sparse gradients and join]): the last
rank joins after 2 steps while the others try 2 more; their steps fail
(allgather refused while a rank has joined) and they join too: join() raises
GradflowError on every rank naming the cause (before: the joined rank's
join() returned as if nothing happened). The next join() and collectives
work again, and so does the same model with sparse_as_dense=True."""
import torch
import torch.nn.functional as F

from gradflow.torch.sparse_join import _REFUSAL

import gradflow.torch as hvd
from _torch_common import assert_close, assert_identical, batch, digits, flat, mlp

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER_RANK = 16


def steps_of(r: int) -> int:
    return 2 + 2 * ((r + 1) % N)  # 2 ranks: rank 0 has 4 steps, rank 1 has 2


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


model = mlp()
opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
for step in range(steps_of(R)):
    opt.zero_grad()
    xb, yb = batch(X, Y, step, R, N, PER_RANK)
    F.cross_entropy(model(xb), yb).backward()
    opt.step()
last = hvd.join()
want_last = max(range(N), key=lambda r: (steps_of(r), -r))
assert last == want_last, (last, want_last)
hvd.broadcast_parameters(model.state_dict(), root_rank=last)
assert_identical(model.parameters(), "join + DistributedOptimizer")

if R == 0:
    ref = mlp()
    ref_opt = sgd(ref)
    for step in range(max(steps_of(r) for r in range(N))):
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(N):
            if step < steps_of(r):
                ref.zero_grad()
                xb, yb = batch(X, Y, step, r, N, PER_RANK)
                F.cross_entropy(ref(xb), yb).backward()
                grads = [g + p.grad for g, p in zip(grads, ref.parameters())]
        for p, g in zip(ref.parameters(), grads):
            p.grad = g / N
        ref_opt.step()
    assert_close(flat(model.parameters()), flat(ref.parameters()), "join + optimizer vs reference",
                 1e-5)
    print(f"join optimizer OK on {N} ranks, last {last}", flush=True)


def sparse_epoch(dense: bool):
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(20, 4, sparse=True), torch.nn.Linear(4, 2)
    named = list(emb.named_parameters(prefix="emb")) + list(head.named_parameters(prefix="head"))
    o = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1),
                                 named_parameters=named, sparse_as_dense=dense)
    refused = 0
    for step in range(2 if R == N - 1 else 4):
        o.zero_grad()
        try:  # reduced when backward returns: the refusal comes from backward()
            F.cross_entropy(head(emb(torch.tensor([step, R + 3]))),
                            torch.tensor([0, 1])).backward()
            o.step()
        except hvd.GradflowError as e:
            assert _REFUSAL in str(e) and not dense, str(e)  # the core's wording, as matched
            refused += 1
    assert refused == (0 if dense or R == N - 1 else 2), refused
    try:
        hvd.join()
    except hvd.GradflowError as e:
        return str(e)
    return None


msg = sparse_epoch(dense=False)
assert msg is not None and f"rank {N - 2} among them" in msg and "sparse_as_dense=True" in msg, msg
assert sparse_epoch(dense=True) is None  # the report was reset; densified gradients may join
total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_sparse_join")
assert total.item() == N, total
print(f"join with sparse gradients OK on rank {R} of {N}", flush=True)
