# torch_sparse_unused_script.py — SPMD: DistributedOptimizer with sparse
# embedding gradients that some ranks (or all) do not produce in a step, on
# every optimizer path (pool, copy, overlap=False, backward_passes_per_step,
# groups=, a process set), plus sparse_as_dense with model.zero_grad() and
# groups= honouring sparse_ratio. Each case is checked against plain torch
# on the concatenated batch (rank 0) and for bitwise-identical parameters.
#
# Run with GRADFLOW_SPARSE_RATIO=0.5, GRADFLOW_SPARSE_CHUNK=4 and
# GRADFLOW_SPARSE_WARMUP_STEPS=0 (test_torch.py): CSC would change every
# result here, so the cases that expect dense results pass sparse_ratio=1.0,
# which must win over the environment on every path (groups= once ignored
# it); the groups CSC case compares against the copy path's CSC.
import sys
import warnings

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close, assert_identical, flat, ok

# Note [Sparse gradients agreed once]: the zero gradient of an unused sparse
# parameter is built with explicit invariant checks; torch's "implicitly
# disabled" warning must not come back.
warnings.filterwarnings("error", message=".*Sparse invariant checks")

hvd.init()
R, N = hvd.rank(), hvd.size()
V, D, B, STEPS = 13, 4, 3, 4
DENSE = {"sparse_ratio": 1.0}
ONLY = sys.argv[1] if len(sys.argv) > 1 else ""  # run only the cases whose name has it


def wanted(what):
    return ONLY in what


class Model(torch.nn.Module):
    """Two sparse embeddings and a dense head; `emb2` only when asked."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, D, sparse=True)
        self.emb2 = torch.nn.Embedding(V, D, sparse=True)
        self.fc = torch.nn.Linear(D, 3)

    def forward(self, idx, use2):
        h = self.emb(idx).mean(1)
        if use2:
            h = h + self.emb2((idx * 3 + 1) % V).mean(1)
        return self.fc(h)


def data(step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randint(0, V, (B, 2), generator=g), torch.randint(0, 3, (B,), generator=g)


# Which ranks use emb2 in pass `t` (a step's passes are t = step*bpps + p).
SCHEDULES = {
    # step 1 only rank 0: the others never saw emb2's gradient (sparse?)
    "first": lambda t, r: r == 0 if t == 0 else (t + r) % 2 == 1,
    # every rank in step 1, then rank 0 only (the zeros' sparse shape)
    "later": lambda t, r: t == 0 or r == 0,
    # no rank in step 1 (reduced dense from then on), later some, all, none
    "none first": lambda t, r: (False, r == N - 1, True, False)[t % 4],
}


def loss_of(m, t, r, use2):
    """Pass t's loss of global rank r, `use2` saying whether it uses emb2."""
    idx, y = data(t, r)
    return F.cross_entropy(m(idx, use2), y)


def reference(use2, bpps, ranks):
    """Plain torch: SGD on the mean over `ranks` of each rank's loss (the
    sum over a step's passes), in one process. The schedule's rank numbers
    are positions in `ranks`."""
    m = Model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(loss_of(m, step * bpps + p, r, use2(step * bpps + p, k))
                   for k, r in enumerate(ranks) for p in range(bpps))
        (loss / len(ranks)).backward()
        opt.step()
    return m


def case(name, schedule, bpps=1, zero="opt", process_set=None, **kw):
    use2 = SCHEDULES[schedule]
    ranks = list(range(N)) if process_set is None else process_set.ranks
    what = f"{name} ({schedule})"
    if R not in ranks or not wanted(what):
        return
    m = Model()
    ps = {} if process_set is None else {"process_set": process_set}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.5), m.named_parameters(),
                                   backward_passes_per_step=bpps, **ps, **kw)
    me = ranks.index(R)
    for step in range(STEPS):
        (m if zero == "model" else opt).zero_grad()
        for p in range(bpps):  # the schedule's rank numbers are positions in the set
            t = step * bpps + p
            loss_of(m, t, R, use2(t, me)).backward()
        opt.step()
    flats = flat(m.parameters())
    everyone = hvd.allgather_object(flats.numpy().tobytes(), process_set=process_set or
                                    hvd.global_process_set)
    assert all(e == everyone[0] for e in everyone), f"{what}: parameters differ between ranks"
    if me == 0:
        ref = reference(use2, bpps, ranks)
        assert_close(flats, flat(ref.parameters()), what)
    if R == ranks[0]:  # one write: rank 0 may be printing too (not a member of `sub`)
        sys.stdout.write(f"ok {what} (size {N})\n")
        sys.stdout.flush()


# 1. sparse embedding unused on some ranks / all ranks in a step
for schedule in SCHEDULES:
    case("pool", schedule, **DENSE)
    case("copy", schedule, use_pool=False, **DENSE)
    case("overlap=False", schedule, overlap=False, **DENSE)
    case("groups=1", schedule, groups=1, **DENSE)  # sparse and dense members in one group
case("bpps=2 pool", "first", bpps=2, **DENSE)
case("bpps=2 copy", "later", bpps=2, use_pool=False, **DENSE)
case("model.zero_grad() pool", "none first", zero="model", **DENSE)
# a process set of the ranks 1.. (on 2 ranks a one-member set: Note [One rank])
sub = hvd.add_process_set(list(range(1, N)))
case("process set", "first", process_set=sub, **DENSE)

# 2. sparse_as_dense + model.zero_grad(): autograd's fresh sparse gradient
# is densified into the pool view (it has no storage to compare or copy)
for use_pool in (True, False):
    case(f"sparse_as_dense model.zero_grad() pool={use_pool}", "first", zero="model",
         sparse_as_dense=True, use_pool=use_pool, **DENSE)
    case(f"sparse_as_dense bpps=2 model.zero_grad() pool={use_pool}", "later", bpps=2,
         zero="model", sparse_as_dense=True, use_pool=use_pool, **DENSE)


# 3. groups= honours sparse_ratio: explicit 1.0 is dense whatever
# GRADFLOW_SPARSE_RATIO says (above: every groups=1 case), an explicit ratio
# is CSC exactly as the copy path's (one residual per tensor), and None
# follows the environment (0.5 here), as the copy path.
def train_dense_model(**kw):
    torch.manual_seed(3)
    w1, w2 = torch.nn.Parameter(torch.randn(16)), torch.nn.Parameter(torch.randn(12))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w1, w2], lr=1.0),
                                   named_parameters=[("w1", w1), ("w2", w2)], **kw)
    for step in range(STEPS):
        opt.zero_grad()
        g = torch.Generator().manual_seed(step * 10 + R)
        c = torch.randint(-8, 9, (28,), generator=g).float() / 8
        ((w1 * c[:16]).sum() + (w2 * c[16:]).sum()).backward()
        opt.step()
    return flat([w1, w2])


for ratio in (0.25, None, 1.0) if wanted("groups sparse_ratio") else ():
    grouped = train_dense_model(groups=2, sparse_ratio=ratio)
    copied = train_dense_model(use_pool=False, sparse_ratio=ratio)
    assert torch.equal(grouped, copied), f"groups sparse_ratio={ratio}: {grouped} vs {copied}"
    assert_identical([grouped], f"groups sparse_ratio={ratio}")
    dense = train_dense_model(use_pool=False, sparse_ratio=1.0)
    assert torch.equal(grouped, dense) == (ratio == 1.0), f"sparse_ratio={ratio}: CSC in effect?"
    ok(f"groups sparse_ratio={ratio} as the copy path")
sys.stdout.write(f"done rank {R}\n")
