# torch_failed_step_script.py — SPMD: a torch DistributedOptimizer step whose
# reduction fails on one rank (or on all) fails on every rank within seconds,
# and after zero_grad() the next steps train normally (optimizer_step.py,
# Note [A failed step]).
"""Each case trains run A, whose step FAIL raises on the failing rank(s)
inside gradflow's reduction (a user Compressor raising, an input the core
refuses, a bucket the core refuses to mark, a step-1 submission raising), and
run B, the same configuration without the failure that skips step FAIL's
batches. Checks, on every rank: the failed step raised within 10 s
(GRADFLOW_TIMEOUT keeps its default, 60 s) with the failing rank's error;
A's parameters equal B's bit for bit after every later step and are bitwise
identical across ranks; for fp32 without CSC both equal a plain-torch
reference that skipped the step. With CSC on the pool path B builds a new
optimizer at the failed step: that is what the failure does to the pools
(their error-feedback residuals are dropped on every rank). CASES
(comma-separated) picks cases; prints "OK <case>" on each rank."""
import os
import sys
import time

import torch
import torch.nn.functional as F

import gradflow
import gradflow.torch as hvd
import gradflow.torch.optimizer as optimizer_module
from _torch_common import assert_close, assert_identical, batch, digits, mlp

hvd.init()
R, N = hvd.rank(), hvd.size()
LAST = N - 1
X, Y = digits()
STEPS, FAIL, PER_RANK, LR = 5, 2, 8, 0.1


class Fault:
    """Where and when run A fails: `kind` is 'compress' (a user Compressor
    raises), 'refuse' (the Compressor hands the core a tensor it refuses),
    'mark' (the core refuses to mark a pool range) or 'submit' (a copy-path
    submission raises before it reaches the core); on `ranks`, at the
    `call`-th such call of step `step`."""

    def __init__(self, kind, ranks, step=FAIL, call=2):
        self.kind, self.ranks, self.step, self.call = kind, ranks, step, call
        self.current, self.calls = -1, 0

    def start_step(self, step):
        self.current, self.calls = step, 0

    def fires(self, kind):
        if kind != self.kind or R not in self.ranks or self.current != self.step:
            return False
        self.calls += 1
        return self.calls == self.call


FAULT = None  # the Fault of the run in progress (None: run B)


class Passthrough:
    """A Horovod-style Compressor: identity, unless FAULT says otherwise."""

    @staticmethod
    def compress(tensor):
        if FAULT is not None and FAULT.fires("compress"):
            raise RuntimeError(f"compressor broke on rank {R}")
        if FAULT is not None and FAULT.fires("refuse"):
            return tensor.to(torch.bool), None  # the core cannot average bools
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


_mark, _allreduce = gradflow._native.pool_mark_ready, optimizer_module.allreduce_async_


def _faulty_mark(pool, r):
    if FAULT is not None and FAULT.fires("mark"):
        raise gradflow._native.GradflowValueError(f"core refused range {r} on rank {R}")
    return _mark(pool, r)


def _faulty_allreduce(*args, **kwargs):
    if FAULT is not None and FAULT.fires("submit"):
        raise ValueError(f"staging failed on rank {R}")
    return _allreduce(*args, **kwargs)


gradflow._native.pool_mark_ready = _faulty_mark
optimizer_module.allreduce_async_ = _faulty_allreduce


class _RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises where FAULT says ('backward'): the
    user's own code failing in the middle of backward, after gradflow's
    hooks submitted the last layer's gradients."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if FAULT is not None and FAULT.fires("backward"):
            raise RuntimeError(f"user backward broke on rank {R}")
        return grad


class RaisingMiddle(torch.nn.Module):
    def forward(self, x):
        return _RaiseInBackward.apply(x)


def raising_mlp():
    """mlp() (same initial weights) with RaisingMiddle before its last layer."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), RaisingMiddle(),
                               torch.nn.Linear(32, 10))


MODEL = mlp  # the model of the case in progress


def make(kw, momentum):
    model = MODEL()
    inner = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    return model, hvd.DistributedOptimizer(inner, model.named_parameters(), **kw)


def one_step(model, opt, step, bpps):
    opt.zero_grad()
    for k in range(bpps):
        xb, yb = batch(X, Y, step * bpps + k, R, N, PER_RANK)
        F.cross_entropy(model(xb), yb).backward()
    opt.step()


def reference(steps, bpps, momentum, failed):
    """Plain torch: SGD on the mean over ranks of each rank's gradient
    (summed over the step's passes), step `failed` skipped."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    for step in range(steps):
        if step == failed:
            continue
        grads = []
        for r in range(N):
            model.zero_grad()
            for k in range(bpps):
                xb, yb = batch(X, Y, step * bpps + k, r, N, PER_RANK)
                F.cross_entropy(model(xb), yb).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / N
        opt.step()
    return model


def run_case(name, kw, fault, bpps=1, exact_reference=True, renew_at_failure=False, tol=0.0,
             model=mlp):
    """`tol` > 0: A and B may differ by that much (relative): a 16-bit wire's
    rounding depends on how the core fused the tensors, which is timing."""
    global FAULT, MODEL
    MODEL = model
    momentum = 0.0 if renew_at_failure else 0.9
    kw = dict(kw, backward_passes_per_step=bpps)
    model_b, opt_b = make(kw, momentum)
    model_a, opt_a = make(kw, momentum)
    failing, failed = R in fault.ranks, fault.step
    for step in range(STEPS):
        FAULT = None
        if step != failed:
            one_step(model_b, opt_b, step, bpps)
        elif renew_at_failure:  # what the failure does to CSC pools: start afresh
            state = model_b.state_dict()
            model_b, opt_b = make(kw, momentum)
            model_b.load_state_dict(state)
        FAULT = fault
        fault.start_step(step)
        t0 = time.time()
        try:
            one_step(model_a, opt_a, step, bpps)
            assert step != failed, f"{name}: rank {R}: step {failed} did not fail"
        except Exception as e:  # noqa: BLE001 - checked below
            took = time.time() - t0
            assert step == failed, f"{name}: rank {R} step {step}: {type(e).__name__}: {e}"
            text = f"{type(e).__name__}: {e}"
            assert took < 10, (name, R, took, text)  # GRADFLOW_TIMEOUT is 60 s
            if failing:  # its own error
                assert NEEDLES[fault.kind] in text, text
            else:
                assert isinstance(e, gradflow.GradflowError), text
                assert "on rank" in text and "before it was submitted" in text, text
            opt_a.zero_grad()  # the recovery: catch, zero_grad(), go on
        FAULT = None
        for pa, pb in zip(model_a.parameters(), model_b.parameters()):
            if tol:
                assert_close(pa.detach(), pb.detach(), f"{name} step {step}: A against B", tol)
            else:
                assert torch.equal(pa, pb), f"{name}: rank {R} step {step}: A differs from B by {(pa - pb).abs().max().item()}"
        assert_identical(list(model_a.parameters()), f"{name} step {step}")
    if exact_reference:
        ref = reference(STEPS, bpps, momentum, failed)
        for pa, pr in zip(model_a.parameters(), ref.parameters()):
            assert_close(pa.detach(), pr.detach(), f"{name}: against plain torch", max(tol, 1e-5))
    sys.stdout.write(f"rank {R}: OK {name}\n")  # one write: the ranks share the stream
    sys.stdout.flush()


NEEDLES = {"compress": "compressor broke", "refuse": "bool", "mark": "core refused",
           "submit": "staging failed", "backward": "user backward broke"}
SMALL = 8 / 1024  # 8 KiB buckets: the mlp's four parameters make three buckets
LAST_ONLY, EVERY = [LAST], list(range(N))
CASES = {
    "copy": lambda: run_case("copy", dict(use_pool=False, compression=Passthrough),
                             Fault("compress", LAST_ONLY)),
    "copy_all": lambda: run_case("copy_all", dict(use_pool=False, compression=Passthrough),
                                 Fault("compress", EVERY)),
    "refused": lambda: run_case("refused", dict(use_pool=False, compression=Passthrough),
                                Fault("refuse", LAST_ONLY)),
    "overlap_off": lambda: run_case("overlap_off", dict(use_pool=False, compression=Passthrough,
                                                        overlap=False),
                                    Fault("compress", LAST_ONLY)),
    "groups": lambda: run_case("groups", dict(groups=2, compression=Passthrough),
                               Fault("compress", LAST_ONLY)),
    "pool": lambda: run_case("pool", dict(bucket_mb=SMALL), Fault("mark", LAST_ONLY)),
    "pool_all": lambda: run_case("pool_all", dict(bucket_mb=SMALL), Fault("mark", EVERY, call=3)),
    "pool_step1": lambda: run_case("pool_step1", dict(bucket_mb=SMALL),
                                   Fault("submit", LAST_ONLY, step=0)),
    "bpps2_pool": lambda: run_case("bpps2_pool", dict(bucket_mb=SMALL), Fault("mark", LAST_ONLY),
                                   bpps=2),
    "bpps2_copy": lambda: run_case("bpps2_copy", dict(use_pool=False, compression=Passthrough),
                                   Fault("compress", LAST_ONLY), bpps=2),
    "fp16_pool": lambda: run_case("fp16_pool", dict(bucket_mb=SMALL,
                                                    compression=hvd.Compression.fp16),
                                  Fault("mark", LAST_ONLY), tol=1e-2),
    "csc_pool": lambda: run_case("csc_pool", dict(bucket_mb=SMALL, sparse_ratio=0.3),
                                 Fault("mark", LAST_ONLY), exact_reference=False,
                                 renew_at_failure=True),
    "csc_copy": lambda: run_case("csc_copy", dict(use_pool=False, sparse_ratio=0.3,
                                                  compression=Passthrough),
                                 Fault("compress", LAST_ONLY, call=3), exact_reference=False),
    "csc_groups": lambda: run_case("csc_groups", dict(groups=2, sparse_ratio=0.3,
                                                      compression=Passthrough),
                                   Fault("compress", LAST_ONLY, call=3), exact_reference=False),
    "user_raises_pool": lambda: run_case("user_raises_pool", dict(bucket_mb=SMALL),
                                         Fault("backward", LAST_ONLY, call=1), model=raising_mlp),
    "user_raises_copy": lambda: run_case("user_raises_copy", dict(use_pool=False),
                                         Fault("backward", LAST_ONLY, call=1), model=raising_mlp),
}
for case in os.environ.get("CASES", ",".join(CASES)).split(","):
    CASES[case]()
hvd.shutdown()
