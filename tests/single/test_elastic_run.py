"""The elastic run loop's sync decision (gradflow/elastic/run.py), with a
fake state and a fake reset standing in for the driver's assignment."""
import importlib

import pytest

from gradflow._basics import HostsUpdatedInterrupt
from gradflow.elastic import worker as worker_mod

run_mod = importlib.import_module("gradflow.elastic.run")  # gradflow.elastic.run is also a function


class FakeState:
    def __init__(self):
        self.calls = []

    def sync(self):
        self.calls.append("sync")

    def restore(self):
        self.calls.append("restore")

    def on_reset(self):
        self.calls.append("on_reset")


class FakeLink:
    """What the run loop reads of DriverLink: the wish it sends with `ready`
    and the driver's decision in the assignment."""
    wants_sync = True
    sync = True


@pytest.mark.parametrize("driver_says", [True, False])
def test_survivor_syncs_when_the_assignment_says_so(monkeypatch, driver_says):
    """The interrupt says 'hosts only removed: skip the sync' (decided before
    the membership is known); the next generation's assignment says whether
    a newcomer is in it. The survivor follows the assignment: it used to
    skip the sync while the newcomer ran it (a stall, then a crash)."""
    link = FakeLink()
    monkeypatch.setattr(worker_mod, "_link", link)
    wishes = []

    def reset():  # the driver's assignment for the next generation
        wishes.append(link.wants_sync)
        link.sync = driver_says

    state, attempts = FakeState(), []

    def train(state):
        attempts.append(1)
        if len(attempts) == 1:
            raise HostsUpdatedInterrupt(True)  # only removed, as agreed at the commit
        return "done"

    assert run_mod.run_fn(train, reset)(state) == "done"
    assert wishes == [False], "the worker must tell the driver it would skip"
    after = ["sync"] if driver_says else []
    assert state.calls == ["sync", "on_reset"] + after


def test_without_a_driver_the_interrupt_decides(monkeypatch):
    monkeypatch.setattr(worker_mod, "_link", None)
    state, attempts = FakeState(), []

    def train(state):
        attempts.append(1)
        if len(attempts) == 1:
            raise HostsUpdatedInterrupt(True)
        if len(attempts) == 2:
            raise HostsUpdatedInterrupt(False)
        return "done"

    assert run_mod.run_fn(train, lambda: None)(state) == "done"
    assert state.calls == ["sync", "on_reset", "on_reset", "sync"]


def test_a_rollback_drops_the_interrupted_steps_gradients():
    """TorchState.restore() after a lost peer: the gradients left by the
    interrupted step (computed with the weights just undone) are dropped. A
    loop that zeroes them after step() (Horovod's accumulation examples) used
    to add them to the first step after the rollback, silently."""
    torch = pytest.importorskip("torch")
    from gradflow.torch import elastic

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    extra = torch.nn.Parameter(torch.ones(2))  # in the optimizer only
    opt = torch.optim.SGD(list(model.parameters()) + [extra], lr=0.1)
    state = elastic.TorchState(model, opt, epoch=0)
    x = torch.randn(4, 3)

    def backward():
        (model(x).sum() * extra.sum()).backward()

    backward()
    clean = [p.grad.clone() for p in model.parameters()]
    opt.zero_grad()
    state.commit()
    backward()  # the interrupted step: its gradients, then a lost peer
    with torch.no_grad():
        model.weight.add_(1.0)
    state.restore()
    assert all(p.grad is None for p in list(model.parameters()) + [extra])
    backward()  # the first step after the rollback sees only its own gradients
    assert all(torch.equal(p.grad, c) for p, c in zip(model.parameters(), clean))


@pytest.mark.parametrize("stall", [True, "job_wide", False])
def test_a_stall_is_reraised_even_after_a_peer_failure_notice(monkeypatch, stall):
    """Note [A stall is no lost peer]: the coordinator fails a stalled
    collective on every rank (a commit() on some ranks only). The first rank
    to raise exits; the driver tells the others, and a rank slower to reach
    the run loop's check found the notice there: it rolled back and asked
    for a generation that its peer's exit had made impossible (2 workers,
    --min-np 2: a 600 s hang). The stall is re-raised whatever came after
    it. An error the notice caused (the interrupted wait) still rolls back."""
    from gradflow._basics import HorovodInternalError
    link = FakeLink()
    link.failure = "gradflowrun elastic: rank 0 (worker 0 on host localhost) exited with code 1"
    monkeypatch.setattr(worker_mod, "_link", link)
    stall_text = ("gradflow stall: 'gradflow.elastic.host_updates' (allreduce) has waited 8 s; "
                  "submitted by ranks [ 1 ], missing on ranks [ 0 ]; every rank has waited 8 s "
                  "for collectives that no rank can complete (names that differ between ranks?):"
                  " failing it on every rank (GRADFLOW_TIMEOUT)")
    mismatch_text = ("gradflow: mismatched shapes for allreduce 'g2': rank 0 has [4], "
                     "rank 1 has [5]")
    error = HorovodInternalError(stall_text if stall is True else mismatch_text if stall else
                                 "gradflow: stopped waiting for the other ranks in allreduce "
                                 "'g2': " + link.failure)
    if stall == "job_wide":  # any error the ranks agreed on, as the core marks it
        error.job_wide = True
    state, resets, attempts = FakeState(), [], []

    def train(state):
        attempts.append(1)
        if len(attempts) == 1:
            raise error
        return "done"

    wrapped = run_mod.run_fn(train, lambda: resets.append(1))
    if stall:
        with pytest.raises(HorovodInternalError) as raised:
            wrapped(state)
        assert raised.value is error
        assert state.calls == ["sync"] and not resets
    else:
        assert wrapped(state) == "done"
        assert state.calls == ["sync", "restore", "on_reset", "sync"] and resets == [1]
