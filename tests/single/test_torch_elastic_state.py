"""gradflow.torch.elastic without a job: ElasticSampler's partitions (every
rank yields the same number of samples, whatever is left of the epoch) and
TorchState's GradScaler handling (saved, restored and replaced in place;
a DistributedOptimizer's grad_scaler= joins the state by itself)."""
import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from gradflow import _runtime  # noqa: E402
from gradflow.torch import elastic  # noqa: E402


def sampler_for(monkeypatch, n, size, rank, processed, shuffle):
    monkeypatch.setattr(_runtime, "is_initialized", lambda: True)
    monkeypatch.setattr(_runtime, "size", lambda: size)
    monkeypatch.setattr(_runtime, "rank", lambda: rank)
    s = elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
    s.load_state_dict({"epoch": 1, "processed_num": processed})
    return s


@pytest.mark.parametrize("shuffle", [False, True])
def test_sampler_gives_every_rank_the_same_count(monkeypatch, shuffle):
    """Any dataset size, group size and point in the epoch (a group that grew
    with fewer samples left than ranks included: 1 left, 3 ranks used to give
    1, 1, 0 and a rank with fewer batches stalls the others): every rank
    yields exactly len() == ceil(left / size) samples; together they cover
    every remaining sample, and repeat only padding (like torch's
    DistributedSampler, which wraps around as often as needed)."""
    checked = 0
    for n in (1, 2, 5, 7, 16, 33):
        for size in range(1, 9):
            for processed in sorted({0, 1, n // 2, max(n - size, 0), max(n - 2, 0), n - 1, n}):
                parts = [list(sampler_for(monkeypatch, n, size, r, processed, shuffle))
                         for r in range(size)]
                left = sampler_for(monkeypatch, n, size, 0, processed, shuffle).remaining_indices
                want = math.ceil(len(left) / size)
                lens = [len(sampler_for(monkeypatch, n, size, r, processed, shuffle))
                        for r in range(size)]
                assert [len(p) for p in parts] == [want] * size == lens, (n, size, processed, parts)
                seen = Counter(i for p in parts for i in p)
                assert set(seen) == set(left), (n, size, processed, parts)
                assert sum(seen.values()) - len(left) == want * size - len(left) < size
                checked += 1
    assert checked > 200


def scale_of(scaler):
    return scaler.state_dict()["scale"]


def optimizer_with(scaler):
    """What TorchState reads of a DistributedOptimizer built with
    grad_scaler= (the wrapper's _gradflow.scaler), without a runtime."""
    from types import SimpleNamespace
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    opt._gradflow = SimpleNamespace(scaler=scaler)
    return opt


@pytest.mark.parametrize("given", [True, False])
def test_grad_scaler_is_committed_and_restored_in_place(monkeypatch, given):
    """TorchState(scaler=s) and, not given, the scaler of an optimizer built
    with grad_scaler=s: commit saves its scale and growth tracker, restore
    puts them back into the same object (the optimizer and the loop hold
    it), and forgets a step interrupted after unscale_()."""
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    opt = optimizer_with(scaler)
    extra = {"scaler": scaler} if given else {}
    scaler.scale(torch.ones(()))  # the scale tensor exists from the first scale()
    state = elastic.TorchState(torch.nn.Linear(2, 2), opt, step=0, **extra)
    scaler.update(16.0)
    state.save()
    scaler.update(64.0)
    opt.param_groups[0]["params"][0].grad = torch.ones(2, 2)
    scaler.unscale_(opt)  # the step a lost peer interrupted
    state.restore()
    assert scale_of(scaler) == 16.0
    scaler.unscale_(opt)  # no "unscale_() has already been called"
    if given:
        assert state.scaler is scaler


@pytest.mark.parametrize("given", [True, False])
def test_grad_scaler_sync_takes_rank_0s_state_in_place(monkeypatch, given):
    """sync() on a rank other than 0: rank 0's scale and growth tracker land
    in this rank's GradScaler object. Given as a plain object, the attribute
    was rebound to an unpickled copy while DistributedOptimizer(grad_scaler=)
    kept reading the original; not given, it kept its own scale."""
    import copy
    rank0 = torch.amp.GradScaler("cpu", init_scale=4096.0, growth_interval=5)
    rank0._init_growth_tracker = 3

    def from_rank_0(obj, root_rank=0, name=None):
        if isinstance(obj, dict) and "scale" in obj:  # a GradScaler's state_dict
            return rank0.state_dict()
        return copy.deepcopy(obj)  # anything else: this rank's, as a copy

    monkeypatch.setattr(elastic, "broadcast_object", from_rank_0)
    monkeypatch.setattr(elastic, "broadcast_parameters", lambda *a, **k: None)
    monkeypatch.setattr(elastic, "broadcast_optimizer_state", lambda *a, **k: None)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=5)
    opt = optimizer_with(scaler)
    extra = {"scaler": scaler} if given else {}
    state = elastic.TorchState(torch.nn.Linear(2, 2), opt, step=0, **extra)
    state.sync()
    assert scaler.state_dict() == rank0.state_dict()
    assert opt._gradflow.scaler is scaler
    if given:
        assert state.scaler is scaler


def scheduler_for(kind, opt):
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)


def advance(kind, sched, opt, times):
    for _ in range(times):
        opt.step()
        sched.step() if kind == "step" else sched.step(1.0)  # a plateau: reduce each time


@pytest.mark.parametrize("kind", ["step", "plateau"])
def test_lr_scheduler_is_committed_and_restored_in_place(kind):
    """TorchState(scheduler=s): a rollback puts the scheduler back to the
    commit in the same object, with the optimizer's learning rate. As a
    plain object it was kept by reference, so after a rollback its epoch
    count ran ahead of the restored optimizer (StepLR decayed at the wrong
    epochs, ReduceLROnPlateau kept its bad-epoch count)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = scheduler_for(kind, opt)
    state = elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    advance(kind, sched, opt, 3)
    state.save()  # commit()'s saving (without its check for host updates)
    saved, lr = sched.state_dict(), opt.param_groups[0]["lr"]
    advance(kind, sched, opt, 3)  # the steps a lost peer interrupted
    assert sched.state_dict() != saved
    state.restore()
    assert state.scheduler is sched and sched.optimizer is opt
    assert sched.state_dict() == saved and opt.param_groups[0]["lr"] == lr


@pytest.mark.parametrize("kind", ["step", "plateau"])
def test_lr_scheduler_sync_takes_rank_0s_state_in_place(monkeypatch, kind):
    """sync() on a rank other than 0: rank 0's scheduler state lands in this
    rank's scheduler, which still drives this rank's optimizer. Before, the
    scheduler was broadcast pickled whole, with its optimizer: the attribute
    became a copy stepping a copy of rank 0's optimizer (and a
    DistributedOptimizer, a class made at run time, could not be pickled)."""
    import copy
    ref_opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    rank0 = scheduler_for(kind, ref_opt)
    advance(kind, rank0, ref_opt, 5)

    def from_rank_0(obj, root_rank=0, name=None):
        if name == "gradflow.elastic.lr_scheduler":
            return copy.deepcopy(rank0.state_dict())
        return copy.deepcopy(obj)  # anything else: this rank's, as a copy

    monkeypatch.setattr(elastic, "broadcast_object", from_rank_0)
    monkeypatch.setattr(elastic, "broadcast_parameters", lambda *a, **k: None)
    monkeypatch.setattr(elastic, "broadcast_optimizer_state", lambda *a, **k: None)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = scheduler_for(kind, opt)
    state = elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    state.sync()
    assert state.scheduler is sched and sched.optimizer is opt
    assert sched.state_dict() == rank0.state_dict()


def test_containers_of_models_and_optimizers_are_restored_in_place():
    """models=[a, b] and optimizers={"a": ..., "b": ...}: each item is
    committed and restored in place by its own handler (a GAN's pair); the
    grad_scaler= of an optimizer inside a container joins the state too. A
    plain value holding a model among other objects raises ValueError (its
    pickled copy would reach ranks > 0 unused)."""
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    ob = optimizer_with(scaler)
    models, opts = [a, b], {"a": oa, "b": ob}
    state = elastic.TorchState(models=models, optimizers=opts, step=0)
    scaler.scale(torch.ones(()))
    state.save()
    saved = [p.detach().clone() for p in list(a.parameters()) + list(b.parameters())]
    with torch.no_grad():
        for p in list(a.parameters()) + list(b.parameters()):
            p.add_(1.0)
    a.weight.grad = torch.ones(2, 2)
    oa.step()  # momentum buffers appear after the commit
    scaler.update(64.0)
    state.restore()
    assert state.models is models and state.optimizers is opts
    for p, q in zip(list(a.parameters()) + list(b.parameters()), saved):
        assert torch.equal(p, q)
    assert oa.state_dict()["state"] == {} and scale_of(scaler) == 8.0
    with pytest.raises(ValueError, match="'extras'"):
        elastic.TorchState(a, oa, extras=[b, 0.5])
    with pytest.raises(ValueError, match="'nested'"):
        elastic.TorchState(a, oa, nested={"inner": [b]})
