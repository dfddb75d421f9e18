# test_hyperparameter_check.py — the torch hyperparameter check's folding
# (gradflow/torch/hyperparameter_check.py), without ranks: which values count
# as equal, which keys are compared, and the tag of a check round.
import sys

import numpy as np
import pytest
import torch

from gradflow.torch import hyperparameter_check as hc


def group(**kw):
    return [dict({"params": [], "lr": 0.1, "momentum": 0.9, "weight_decay": 0,
                  "nesterov": False, "betas": (0.9, 0.999)}, **kw)]


@pytest.mark.parametrize("same", [
    {"lr": np.float64(0.1)}, {"lr": torch.tensor(0.1, dtype=torch.float64)},
    {"weight_decay": 0.0}, {"weight_decay": np.int64(0)}, {"nesterov": np.bool_(False)},
    {"betas": [0.9, 0.999]}, {"params": [torch.zeros(2)]},
    {"my_rank": 3}, {"initial_lr": 7.0}, {"foreach": True}])
def test_values_that_act_alike_fold_alike(same):
    assert hc.fold(0, group(**same)) == hc.fold(0, group())


@pytest.mark.parametrize("other", [
    {"lr": 0.1000001}, {"momentum": 0.0}, {"weight_decay": 1e-4}, {"nesterov": True},
    {"betas": (0.9, 0.99)}, {"lr": torch.tensor(0.1)}, {"eps": 1e-8}])
def test_a_different_value_folds_differently(other):
    # torch.tensor(0.1) is float32: another learning rate than 0.1 in fact
    assert hc.fold(0, group(**other)) != hc.fold(0, group())


def test_crc_keeps_a_past_difference():
    a = hc.fold(hc.fold(0, group(lr=0.2)), group())
    b = hc.fold(hc.fold(0, group()), group())
    assert a != b


def test_tag_only_on_check_rounds_and_join_restarts_the_count():
    class State:  # what begin_round reads of the optimizer's _State
        solo, pools, bpps, prefix, names, params = False, [], 1, "", [], []
    s = State()
    hc.reset(s)
    tags = []
    for _ in range(2 * hc.CHECK_EVERY):
        hc.begin_round(s, group())
        tags.append(s.step_tag)
    tagged = [i + 1 for i, t in enumerate(tags) if t]
    assert tagged == [hc.CHECK_EVERY, 2 * hc.CHECK_EVERY], tagged
    assert tags[hc.CHECK_EVERY - 1].startswith("hyperparameters #")
    assert "now group 0: lr=0.1, momentum=0.9" in tags[hc.CHECK_EVERY - 1]
    # local values too: the passes per step and the count of step() calls
    assert tags[hc.CHECK_EVERY - 1].endswith("backward_passes_per_step=1, steps=0")
    for _ in range(5):
        hc.begin_round(s, group())
    hc._after_join()
    assert s.hyper_rounds == 0 and s.hyper_crc == 0


def test_description_is_bounded():
    text = hc.describe([{"lr": 0.1 * i, "momentum": 0.9} for i in range(100)])
    assert len(text) <= 240 and text.endswith("...")


def test_key_order_does_not_matter():
    g = group(eps=1e-8, alpha=0.99)
    assert hc.fold(0, [dict(reversed(list(g[0].items())))]) == hc.fold(0, g)


class _FakeState:  # what begin_round and note_caller read of the optimizer's _State
    solo, pools, bpps, prefix, names, params, scaler = False, [], 1, "", [], [], None


def _check_tag(scaler=None, seen=None):
    s = _FakeState()
    hc.reset(s)
    s.scaler = scaler
    for _ in range(hc.CHECK_EVERY):
        s.seen_scaler = seen  # reset() clears it; the wrapper's step() finds it
        hc.begin_round(s, group())
    return s.hyper_crc, s.step_tag


def test_grad_scaler_state_is_checked_and_shown_first():
    # Note [Loss scales agree]: the scale (and growth state) of grad_scaler=,
    # or of the GradScaler found stepping the optimizer, is folded and shown
    # before the param groups (the 240-character cut never hides it)
    crc, tag = _check_tag()
    assert "grad_scaler" not in tag
    a = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    b = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    crc_a, tag_a = _check_tag(scaler=a)
    assert "now grad_scaler: scale=65536.0, growth_tracker=0, growth_factor=2.0, " \
           "backoff_factor=0.5, growth_interval=2000; group 0: lr=0.1" in tag_a, tag_a
    assert len({crc, crc_a, _check_tag(scaler=b)[0]}) == 3
    assert _check_tag(seen=a) == (crc_a, tag_a)
    assert "grad_scaler: enabled=False;" in _check_tag(
        scaler=torch.amp.GradScaler("cpu", enabled=False))[1]


def test_a_grad_scaler_stepping_the_optimizer_is_found():
    s = _FakeState()
    hc.reset(s)
    scaler = torch.amp.GradScaler("cpu")

    class Opt(torch.optim.SGD):
        def step(self, closure=None):
            hc.note_caller(s, sys._getframe(1))
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(2))
    opt = Opt([p], lr=0.1)
    opt.step()  # not through a scaler: nothing found
    assert s.seen_scaler is None
    scaler.scale(p.sum()).backward()
    scaler.step(opt)
    assert s.seen_scaler is scaler
    hc._after_join()  # found again after join() on every rank alike
    assert s.seen_scaler is None
