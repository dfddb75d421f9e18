# test_keras_hyperparameter_check.py — the Keras hyperparameter check's folding
# (gradflow/keras/hyperparameter_check.py) and the shared tag text
# (gradflow/hyperparameter_tag.py), without ranks: which values count, when a
# round is tagged, what restarts the count.
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gradflow import _runtime, collectives  # noqa: E402
from gradflow import hyperparameter_tag as tag  # noqa: E402
from gradflow.keras import hyperparameter_check as hc  # noqa: E402


_KEEP = []  # the check holds its optimizer weakly (the optimizer owns the check)


def check_of(opt):
    _KEEP.append(opt)
    return hc.HyperparameterCheck(opt)


def run_rounds(check, n, lr=0.05):
    return [check.begin(np.array([lr], np.float64)) for _ in range(n)]


def test_only_every_16th_round_is_tagged_with_the_values():
    check = check_of(keras.optimizers.SGD(0.05, momentum=0.9))
    tags = run_rounds(check, 2 * tag.CHECK_EVERY)
    tagged = [i for i, t in enumerate(tags) if t]
    assert tagged == [tag.CHECK_EVERY - 1, 2 * tag.CHECK_EVERY - 1]
    t = tags[tag.CHECK_EVERY - 1]
    assert t.startswith("hyperparameters #"), t
    assert "now group 0: learning_rate=0.05, momentum=0.9, nesterov=False" in t, t
    assert "clipnorm" not in t  # attributes left at None are not listed


def test_a_single_round_with_another_rate_changes_the_tag():
    a, b = check_of(keras.optimizers.SGD(0.05)), check_of(keras.optimizers.SGD(0.05))
    ta = run_rounds(a, tag.CHECK_EVERY)
    tb = run_rounds(b, 3) + [b.begin(np.array([0.1]))] + run_rounds(b, tag.CHECK_EVERY - 4)
    assert ta[-1] != tb[-1]
    assert ta[-1].split(" now ")[1] == tb[-1].split(" now ")[1]  # the same current values


@pytest.mark.parametrize("other", [
    dict(learning_rate=0.05, momentum=0.5), dict(learning_rate=0.05, nesterov=True),
    dict(learning_rate=0.05, weight_decay=1e-4), dict(learning_rate=0.05, clipnorm=1.0)])
def test_other_attributes_fold_differently(other):
    a = run_rounds(check_of(keras.optimizers.SGD(0.05)), tag.CHECK_EVERY)[-1]
    b = run_rounds(check_of(keras.optimizers.SGD(**other)), tag.CHECK_EVERY)[-1]
    assert a != b


def test_rates_that_act_alike_fold_alike():
    # the learning rate arrives as float64 from a float32 variable
    a = run_rounds(check_of(keras.optimizers.Adam(0.05)), tag.CHECK_EVERY,
                   lr=float(np.float32(0.05)))[-1]
    b = run_rounds(check_of(keras.optimizers.Adam(0.05)), tag.CHECK_EVERY, lr=0.05)[-1]
    assert a == b and "learning_rate=0.05," in a and "beta_1=0.9" in a, a
    assert hc._plain(np.float64(1.0)) == hc._plain(1) == 1.0
    assert hc._plain(np.bool_(True)) is True
    assert hc._plain((1, np.float32(0.5))) == (1.0, 0.5)
    assert hc._plain(keras.Variable(1.0)) == "Variable"  # not read, not repr'd


def test_eager_begin_reads_the_current_rate_of_a_schedule():
    sched = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = keras.optimizers.SGD(sched)
    check = check_of(opt)
    for _ in range(tag.CHECK_EVERY - 1):
        check.begin_eager()
    assert "learning_rate=0.1," in check.begin_eager()  # iterations is still 0
    opt.iterations.assign(2)
    for _ in range(tag.CHECK_EVERY - 1):
        check.begin_eager()
    assert "learning_rate=0.025," in check.begin_eager()


def multi(head_rate=0.01):
    return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
        keras.optimizers.SGD(0.1), {"head/.*": keras.optimizers.Adam(head_rate)}))


def test_a_multi_optimizer_is_checked_per_inner_optimizer():
    # A wrapped MultiOptimizer has no learning rate of its own (Keras raises
    # AttributeError on reading it: before, the first step did).
    check = check_of(multi())
    (rates,) = check.inputs()
    assert keras.ops.convert_to_numpy(rates).tolist() == pytest.approx([0.01, 0.1])
    for _ in range(tag.CHECK_EVERY - 1):
        check.begin_eager()
    t = check.begin_eager()
    assert "group 0: learning_rate=0.01, beta_1=0.9" in t and \
        "group 1: learning_rate=0.1, momentum=0.0" in t, t
    other = check_of(multi(head_rate=0.02))
    for _ in range(tag.CHECK_EVERY - 1):
        other.begin_eager()
    assert other.begin_eager() != t  # one inner optimizer's rate differs


def test_join_and_a_new_generation_restart_the_count_broadcast_the_crc(monkeypatch):
    check = check_of(keras.optimizers.SGD(0.05))
    run_rounds(check, 5)
    for callback in collectives.after_join:
        callback()
    assert (check.rounds, check.crc) == (0, 0)
    run_rounds(check, 5)
    monkeypatch.setattr(_runtime, "_generation", _runtime.generation() + 1)
    assert run_rounds(check, 1) == [""] and check.rounds == 1
    crc = check.crc
    hc.restart_crc_of(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))  # not ours
    assert check.crc == crc
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05))
    lso.inner_optimizer._gradflow_hyper = check
    hc.restart_crc_of(lso)  # through the LossScaleOptimizer to the wrapper
    assert check.crc == 0 and check.rounds == 1


def test_tags_of_two_checks_are_joined():
    assert tag.combine("3 of 4 gradients #ab", "") == "3 of 4 gradients #ab"
    assert tag.combine("", "hyperparameters #1 now x") == "hyperparameters #1 now x"
    assert tag.combine("3 of 4 gradients #ab", "hyperparameters #1 now x") == \
        "3 of 4 gradients #ab & hyperparameters #1 now x"
