"""gradflow.torch.FusedLinear: the weight gradient accumulates in place into
an existing weight.grad; everything else is nn.Linear. Compared with
nn.Linear on the same weights (values, accumulation, hooks, shapes, tied
weights, the fall-back paths), in one process: no communication involved."""
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")

if importlib.util.find_spec("torch") is not None:
    import torch
    import torch.nn.functional as F

    from gradflow.torch import FusedLinear, fuse_linear_grad_accumulation


def _pair(inp=7, out=5, bias=True):
    torch.manual_seed(0)
    plain = torch.nn.Linear(inp, out, bias=bias).double()
    fused = FusedLinear(inp, out, bias=bias).double()
    fused.load_state_dict(plain.state_dict())
    return plain, fused


def _hooked(layer):
    calls = []
    for p in layer.parameters():
        p.register_post_accumulate_grad_hook(lambda p, calls=calls: calls.append(p))
    return calls


@pytest.mark.parametrize("shape", [(4, 7), (3, 4, 7), (2, 3, 2, 7)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("existing_grad", [False, True])
def test_matches_nn_linear(shape, bias, existing_grad):
    plain, fused = _pair(bias=bias)
    x = torch.randn(*shape, dtype=torch.float64)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    if existing_grad:  # e.g. a DistributedOptimizer pool view, or set_to_none=False
        for layer in (plain, fused):
            for p in layer.parameters():
                p.grad = torch.full_like(p, 0.25)
    calls = _hooked(fused)
    w_grad = fused.weight.grad
    outs = [layer(xi) for layer, xi in zip((plain, fused), xs)]
    assert torch.equal(outs[0], outs[1])
    for o in outs:
        (o.sin().sum()).backward()
    for a, b in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-12, atol=1e-12)
    # hooks fire once per parameter and backward, fused or not
    assert sorted(id(p) for p in calls) == sorted(id(p) for p in fused.parameters())
    if existing_grad:  # accumulated in place: the same tensor (a pool view stays a view)
        assert fused.weight.grad is w_grad


def test_accumulates_over_several_backwards_in_place():
    plain, fused = _pair()
    fused.weight.grad = torch.zeros_like(fused.weight)
    buf = fused.weight.grad
    for i in range(3):
        x = torch.randn(6, 7, dtype=torch.float64)
        for layer in (plain, fused):
            F.mse_loss(layer(x), torch.ones(6, 5, dtype=torch.float64) * i).backward()
    assert fused.weight.grad is buf
    torch.testing.assert_close(fused.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)


def test_tied_weight_used_twice_and_by_another_op():
    # One weight through the fused layer twice and through a plain matmul:
    # the sum is complete and the readiness hook fires once, after all of it.
    plain, fused = _pair(inp=5, out=5)
    for layer in (plain, fused):
        layer.weight.grad = torch.zeros_like(layer.weight)
    seen = []
    fused.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    x = torch.randn(3, 5, dtype=torch.float64)
    for layer in (plain, fused):
        y = layer(torch.tanh(layer(x)))
        (y.sum() + (x @ layer.weight).pow(2).sum()).backward()
    torch.testing.assert_close(fused.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)
    assert len(seen) == 1 and torch.equal(seen[0], fused.weight.grad)


def test_create_graph_falls_back_and_second_order_matches():
    plain, fused = _pair()
    x = torch.randn(4, 7, dtype=torch.float64)
    gs = []
    for layer in (plain, fused):
        layer.weight.grad = torch.zeros_like(layer.weight)
        (gw,) = torch.autograd.grad(layer(x).pow(3).sum(), [layer.weight], create_graph=True)
        (ggw,) = torch.autograd.grad(gw.sum(), [layer.weight])
        gs.append((gw.detach(), ggw))
    torch.testing.assert_close(gs[1][0], gs[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gs[1][1], gs[0][1], rtol=1e-12, atol=1e-12)
    assert torch.equal(fused.weight.grad, torch.zeros_like(fused.weight))  # autograd.grad: untouched


@pytest.mark.filterwarnings("ignore:grad and param do not obey")  # the noncontiguous case
@pytest.mark.parametrize("case", ["none", "noncontiguous", "frozen", "no_grad", "autocast"])
def test_fall_back_paths_give_nn_linear_results(case):
    plain, fused = _pair()
    x = torch.randn(4, 7, dtype=torch.float64)
    if case == "noncontiguous":
        for layer in (plain, fused):
            layer.weight.grad = torch.zeros(7, 5, dtype=torch.float64).t()
    if case == "frozen":
        for layer in (plain, fused):
            layer.weight.requires_grad_(False)
    if case == "no_grad":
        with torch.no_grad():
            assert torch.equal(plain(x), fused(x))
        return
    if case == "autocast":
        plain, fused = plain.float(), fused.float()
        x = x.float()
        outs = []
        for layer in (plain, fused):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
            y.float().sum().backward()
            outs.append(y)
        assert outs[1].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
        assert torch.equal(fused.weight.grad, plain.weight.grad)
        return
    for layer in (plain, fused):
        layer(x).sum().backward()
    for a, b in zip(plain.parameters(), fused.parameters()):
        if a.grad is None:
            assert b.grad is None
        else:
            torch.testing.assert_close(b.grad.double(), a.grad.double(), rtol=1e-6, atol=1e-6)


def test_fuse_swaps_plain_linears_only():
    class Custom(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), Custom(4, 4),
                                torch.nn.Sequential(torch.nn.Linear(4, 2)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    assert fuse_linear_grad_accumulation(model) is model
    assert type(model[0]) is FusedLinear and type(model[3][0]) is FusedLinear
    assert type(model[2]) is Custom
    assert list(model.parameters()) == params  # same Parameter objects
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    layer = torch.nn.Linear(2, 2)
    assert type(fuse_linear_grad_accumulation(layer)) is FusedLinear


def test_float32_training_matches_plain_within_rounding():
    # persistent .grad (set_to_none=False): the fused path on every step
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    fused = fuse_linear_grad_accumulation(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    fused.load_state_dict(plain.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, fused)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        for m, o in zip((plain, fused), opts):
            o.zero_grad(set_to_none=False)
            F.cross_entropy(m(x), y).backward()
            o.step()
    for a, b in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_autograd_grad_and_backward_inputs_leave_other_grads_alone():
    # torch.autograd.grad() returns the gradient and must not touch .grad;
    # backward(inputs=[x]) accumulates into x only.
    plain, fused = _pair()
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    for layer in (plain, fused):
        layer.weight.grad = torch.zeros_like(layer.weight)
    got = [torch.autograd.grad(layer(x).sum(), [layer.weight])[0] for layer in (plain, fused)]
    torch.testing.assert_close(got[1], got[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(fused.weight.grad, torch.zeros_like(fused.weight))
    fused(x).sum().backward(inputs=[x])
    assert torch.equal(fused.weight.grad, torch.zeros_like(fused.weight)) and x.grad is not None
    fused(x).sum().backward(inputs=[fused.weight])
    torch.testing.assert_close(fused.weight.grad, got[0], rtol=1e-12, atol=1e-12)


def test_weight_tensor_hook_sees_and_changes_the_gradient():
    # A register_hook() hook on the weight must see its gradient and may
    # change it (clipping, DP noise): the fused path would bypass it.
    plain, fused = _pair()
    seen = []
    for layer in (plain, fused):
        layer.weight.grad = torch.zeros_like(layer.weight)
        layer.weight.register_hook(lambda g, seen=seen: (seen.append(g.clone()), g * 2)[1])
    x = torch.randn(4, 7, dtype=torch.float64)
    for layer in (plain, fused):
        layer(x).sum().backward()
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])
    torch.testing.assert_close(fused.weight.grad, plain.weight.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused.weight.grad, 2 * seen[0], rtol=1e-12, atol=1e-12)
