"""`DistributedOptimizer(...).lr`: Keras 2's alias of `learning_rate`, which
Horovod's Keras examples use in their elastic reset callback
(`tf.keras.backend.set_value(state.model.optimizer.lr, x)`, Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py). Keras 3
removed it, so that callback raised AttributeError on the first reset and
the elastic job died instead of recovering. One process, no job."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import gradflow.keras as hvd  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    hvd.init()  # a one-rank job: fit() reduces (as the identity) through the core
    yield


def _compiled(opt):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=opt, loss="mse")
    x = np.random.default_rng(0).random((8, 4), dtype=np.float32)
    model.fit(x, np.ones((8, 3), np.float32), batch_size=8, epochs=1, verbose=0)
    return model


def test_lr_reads_and_sets_the_learning_rate():
    model = _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.001)))
    opt = model.optimizer
    assert float(opt.lr) == pytest.approx(0.001)
    tf.keras.backend.set_value(opt.lr, 0.004)       # the Horovod Keras example's reset
    assert float(opt.learning_rate) == pytest.approx(0.004)
    opt.lr.assign(0.002)                            # the TF2 example's spelling
    assert float(opt.learning_rate) == pytest.approx(0.002)
    opt.lr = 0.003                                  # Keras 2's setter
    assert float(opt.learning_rate) == pytest.approx(0.003)
    model.fit(np.zeros((8, 4), np.float32), np.ones((8, 3), np.float32), verbose=0)
    assert float(opt.lr) == pytest.approx(0.003)    # still the variable the step reads


def test_lr_of_a_schedule_is_the_schedule():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(schedule))
    assert isinstance(opt.lr, keras.optimizers.schedules.ExponentialDecay)


def test_lr_through_a_loss_scale_optimizer():
    # --use-mixed-precision in Horovod's example: compile() puts Keras's
    # LossScaleOptimizer around the wrapped one, and the reset callback reads
    # model.optimizer.lr (Keras 2's LossScaleOptimizer had it).
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.001)))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = model.optimizer
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    tf.keras.backend.set_value(opt.lr, 0.004)
    assert float(opt.inner_optimizer.learning_rate) == pytest.approx(0.004)
    opt.lr = 0.003
    assert float(opt.learning_rate) == pytest.approx(0.003)
    # Around a plain Keras optimizer nothing changes: Keras 3 has no lr there.
    plain = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.001))
    assert not hasattr(plain, "lr")
