"""gradflow.keras.elastic without a job (the 3-worker fault test is
tests/parallel/test_elastic_keras.py): KerasState's in-memory commit and
rollback of weights and optimizer slots, the epoch/batch callbacks' counters
and which errors from model.fit the run loop treats as a lost peer."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import gradflow.keras.elastic as elastic  # noqa: E402
from gradflow import HorovodInternalError  # noqa: E402


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def _fit_one(model):
    x = np.random.default_rng(0).random((8, 4), dtype=np.float32)
    model.fit(x, np.ones((8, 3), np.float32), batch_size=8, epochs=1, verbose=0)


def test_state_restores_last_commit():
    model = _model()
    state = elastic.KerasState(model, epoch=0, batch=0)
    _fit_one(model)
    state.epoch = 1
    state.commit()  # outside elastic mode: save only
    weights = [w.copy() for w in model.get_weights()]
    slots = [keras.ops.convert_to_numpy(v).copy() for v in model.optimizer.variables]
    _fit_one(model)
    state.epoch = 2
    assert not np.allclose(model.get_weights()[0], weights[0])
    state.restore()
    assert state.epoch == 1
    for a, b in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    for v, b in zip(model.optimizer.variables, slots):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), b)


def test_state_refuses_an_unbuilt_model():
    # Its weights do not exist yet: sync() would broadcast nothing and each
    # rank would train from its own initial weights.
    model = keras.Sequential([keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ValueError, match="needs a built model"):
        elastic.KerasState(model, epoch=0)
    model.build((None, 4))
    assert elastic.KerasState(model, epoch=0).epoch == 0


def test_epoch_and_batch_callbacks_count_across_calls():
    model = _model()
    state = elastic.KerasState(model, epoch=2, batch=0)
    cbs = [elastic.UpdateEpochStateCallback(state), elastic.UpdateBatchStateCallback(state)]
    x = np.zeros((12, 4), np.float32)
    seen = []
    probe = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(state.batch))
    model.fit(x, np.zeros((12, 3), np.float32), batch_size=4, epochs=2, verbose=0,
              callbacks=cbs + [probe])
    assert state.epoch == 4 and state.batch == 0
    assert seen == [1, 2, 3, 1, 2, 3]
    with pytest.raises(ValueError):
        elastic.CommitStateCallback(state, batches_per_commit=0)


def test_run_maps_only_peer_loss_to_internal_error(monkeypatch):
    def raises(exc):
        def func(state):
            raise exc
        return elastic._as_internal_error(func)

    tf_error = tf.errors.UnknownError(None, None, "HorovodInternalError: peer gone")
    monkeypatch.setattr(elastic, "_peer_lost", lambda error=None: True)
    with pytest.raises(HorovodInternalError):
        raises(tf_error)(None)
    with pytest.raises(ValueError):  # not a TF op error: a bug in the user's code
        raises(ValueError("bad"))(None)
    monkeypatch.setattr(elastic, "_peer_lost", lambda error=None: False)
    with pytest.raises(tf.errors.UnknownError):  # no peer lost: fails as it is
        raises(tf_error)(None)


def test_tensorflow_state_commits_and_restores_variables():
    import gradflow.tensorflow.elastic as tf_elastic
    v = tf.Variable(np.arange(4, dtype=np.float32))
    state = tf_elastic.TensorFlowState([v], epoch=0)
    v.assign_add(np.ones(4, np.float32))
    state.epoch = 1
    state.commit()  # outside elastic mode: save only
    v.assign(np.zeros(4, np.float32))
    state.epoch = 2
    state.restore()
    np.testing.assert_array_equal(v.numpy(), np.arange(4, dtype=np.float32) + 1)
    assert state.epoch == 1
    with pytest.raises(ValueError, match="needs its variables"):
        tf_elastic.TensorFlowState()
    with pytest.raises(TypeError, match="tf.Variables"):
        tf_elastic.TensorFlowState([np.zeros(2)])
    assert tf_elastic.TensorFlowKerasState is elastic.KerasState


def test_tensorflow_state_takes_keras_variables():
    # its own docstring's recipe: TensorFlowState(model.variables + optimizer.variables);
    # Keras 3 Variables are not tf.Variables (before 2026-11-27: TypeError)
    import gradflow.tensorflow.elastic as tf_elastic
    model = _model()
    _fit_one(model)
    state = tf_elastic.TensorFlowState(model.variables + model.optimizer.variables, epoch=0)
    saved = [keras.ops.convert_to_numpy(v).copy() for v in state.variables]
    _fit_one(model)
    state.restore()
    for want, v in zip(saved, state.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), want)
