"""join() with a DistributedOptimizer that accumulates (backward_passes_per_step
= 2), where some ranks' data ends inside a window: the loop steps every 2
batches, so a rank with an odd batch count calls join() with one backward
pass of a step that was never reduced. join() drops that unfinished step on
every rank (with a warning there, and none elsewhere), so after the
parameter and optimizer-state broadcast the next epoch's steps pair up on
every rank. Before the fix its passes stayed counted: that rank reduced
after one pass of the next epoch while the others waited for two, and the
job stalled until GRADFLOW_TIMEOUT. Checked on the pool, copy and
no-overlap paths: parameters bitwise identical on every rank and equal to a
plain-torch reference that averages the active ranks' gradients over size
(the dropped pass takes no part)."""
import warnings

import torch
import torch.nn.functional as F

import gradflow.torch as hvd
from _torch_common import assert_close, assert_identical, batch, digits, flat, mlp

hvd.init()
R, N = hvd.rank(), hvd.size()
X, Y = digits()
PER_RANK, BPPS, EPOCH2 = 8, 2, 4


def passes_of(r: int) -> int:
    # 2 ranks: 6 and 3 passes; 3: 6, 9, 3; 4: 6, 9, 12, 3 (odd counts leave a pass over)
    return 3 + 3 * ((r + 1) % N)


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def grad_of(model, seed: int, r: int):
    model.zero_grad()
    xb, yb = batch(X, Y, seed, r, N, PER_RANK)
    F.cross_entropy(model(xb), yb).backward()
    return [p.grad.clone() for p in model.parameters()]


def reference():
    """Plain torch: step t averages (over N) the two passes of every rank that
    completed window t; a rank's leftover pass is dropped."""
    ref = mlp()
    opt = sgd(ref)
    steps = [(r, passes_of(r) // BPPS) for r in range(N)]
    for epoch_start, steps_of in ((0, dict(steps)), (100, {r: EPOCH2 // BPPS for r in range(N)})):
        for t in range(max(steps_of.values())):
            total = [torch.zeros_like(p) for p in ref.parameters()]
            for r in range(N):
                if t < steps_of[r]:
                    for k in range(BPPS):
                        total = [a + g for a, g in
                                 zip(total, grad_of(ref, epoch_start + t * BPPS + k, r))]
            for p, g in zip(ref.parameters(), total):
                p.grad = g / N
            opt.step()
    return ref


def train(model, opt, passes: int, start: int) -> None:
    opt.zero_grad()
    for i in range(passes):
        xb, yb = batch(X, Y, start + i, R, N, PER_RANK)
        F.cross_entropy(model(xb), yb).backward()
        if (i + 1) % BPPS == 0:
            opt.step()
            opt.zero_grad()


want = reference()
for path, kw in (("pool", {}), ("copy", {"use_pool": False}), ("no-overlap", {"overlap": False})):
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=BPPS, **kw)
    train(model, opt, passes_of(R), 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        last = hvd.join()
    said = [str(w.message) for w in caught if "join() was called with" in str(w.message)]
    left = passes_of(R) % BPPS
    assert len(said) == (1 if left else 0), (path, said)
    assert not said or f"with {left} of backward_passes_per_step=2" in said[0], said
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    hvd.broadcast_optimizer_state(opt, root_rank=last)
    train(model, opt, EPOCH2, 100)  # every rank, whole windows
    assert_identical(model.parameters(), f"{path}: join with an unfinished step")
    assert_close(flat(model.parameters()), flat(want.parameters()), f"{path} vs reference", 1e-5)
    if R == 0:
        print(f"join accumulation {path} OK on {N} ranks", flush=True)
