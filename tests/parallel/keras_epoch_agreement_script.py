# tests/parallel/keras_epoch_agreement_script.py — SPMD script (run by
# test_tensorflow.py under mpiexec, 2 and 3 ranks, default GRADFLOW_TIMEOUT
# of 60 s): gradflow.keras.EpochAgreementCallback at Keras `fit`'s epoch
# boundaries (Note [Keras epoch boundaries], gradflow/keras/epoch_agreement.py).
#   equal: the same batch count everywhere and EarlyStopping on an averaged
#     metric: nothing raises, the weights are bitwise identical on every rank
#     and equal to the same training without the callback.
#   uneven: the last rank has one batch more per epoch, MetricAverageCallback
#     after the callback: every rank's fit raises GradflowError naming each
#     rank's batch count, within seconds (without the callback: 60.7 s, then a
#     TensorFlow UnknownError with the core's stall message).
#   sync: the same data with uneven_batches="sync": training goes on as under
#     join() (the extra batch reduced with zeros from the others), every rank
#     ends with the last rank's variables: bitwise identical, and equal to a
#     single-process reference of that arithmetic.
#   stop: rank 0 alone sets model.stop_training after epoch 1 (EarlyStopping
#     on a rank-local metric): every rank raises GradflowError naming rank 0,
#     within seconds, and the runtime stays usable.
# Exits non-zero on failure.
import time
import warnings

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.keras as gk  # noqa: E402
import gradflow.tensorflow as gtf  # noqa: E402

gk.init()
R, N = gk.rank(), gk.size()
B, S, LR = 8, 3, 0.1
FAST = 30.0  # seconds: a stall would take GRADFLOW_TIMEOUT (60 s) at least


def make_model(seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=gk.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    return model


def batches_of(r):
    """Rank r's batch count per epoch in the uneven cases: the last rank one more."""
    return S + 1 if r == N - 1 else S


def rank_data(r, batches):
    rng = np.random.default_rng(100 + r)
    return (rng.normal(size=(batches * B, 5)).astype(np.float32),
            rng.normal(size=(batches * B, 2)).astype(np.float32))


def identical_everywhere(model, what):
    blobs = gtf.allgather_object(b"".join(w.numpy().tobytes() for w in model.weights))
    assert all(b == blobs[0] for b in blobs), f"{what}: ranks differ"


def fit_raises(model, x, y, callbacks, epochs, *words):
    t0 = time.monotonic()
    try:
        model.fit(x, y, batch_size=B, epochs=epochs, verbose=0, shuffle=False,
                  callbacks=callbacks)
    except gk.GradflowError as e:
        took = time.monotonic() - t0
        assert all(w in str(e) for w in words), str(e)
        assert took < FAST, f"raised after {took:.1f} s"
        return took
    raise AssertionError(f"fit did not raise ({words})")


def check_equal():
    x, y = rank_data(R, S)
    runs = []
    for with_callback in (True, False):
        model = make_model()
        early = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
        cbs = [gk.MetricAverageCallback(), early]
        if with_callback:
            cbs.insert(0, gk.EpochAgreementCallback())
        hist = model.fit(x, y, batch_size=B, epochs=4, verbose=0, shuffle=False, callbacks=cbs)
        assert len(hist.history["loss"]) == 2, hist.history  # stopped after epoch 2, everywhere
        identical_everywhere(model, f"equal, callback={with_callback}")
        runs.append([w.numpy() for w in model.weights])
    for a, b in zip(*runs):
        # At 3+ ranks the ring's summation order follows timing (two runs may
        # differ in the last bits; architecture.md, Reproducibility).
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg="with vs without")


def check_uneven():
    x, y = rank_data(R, batches_of(R))
    counts = ", ".join(f"rank {r}: {batches_of(r)}" for r in range(N))
    took = fit_raises(make_model(), x, y, [gk.EpochAgreementCallback(), gk.MetricAverageCallback()],
                      2, "different numbers of batches in epoch 1", counts)
    print(f"rank {R}: uneven batches raised after {took:.1f} s", flush=True)


def reference_sync(epochs):
    """One process: in each epoch, batch s < S is the average of every
    rank's gradient; the last rank's extra batch its gradient over N (the
    others joined, contributing zeros); then all take the last rank's weights."""
    ref = make_model()
    data = [rank_data(r, batches_of(r)) for r in range(N)]
    for _ in range(epochs):
        for s in range(S + 1):
            total = None
            for r in range(N):
                if s >= batches_of(r):
                    continue
                xb, yb = data[r][0][s * B:(s + 1) * B], data[r][1][s * B:(s + 1) * B]
                with tf.GradientTape() as tape:
                    loss = keras.losses.mean_squared_error(yb, ref(xb, training=True))
                    loss = tf.reduce_mean(loss)
                g = [v.numpy().astype(np.float64)
                     for v in tape.gradient(loss, ref.trainable_variables)]
                total = g if total is None else [a + b for a, b in zip(total, g)]
            for v, gsum in zip(ref.trainable_variables, total):
                v.assign((v.numpy() - LR * gsum / N).astype(np.float32))
    return [w.numpy() for w in ref.weights]


def check_sync():
    x, y = rank_data(R, batches_of(R))
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False,
                  callbacks=[gk.EpochAgreementCallback("sync"), gk.MetricAverageCallback()])
    if R == 0:
        said = [str(w.message) for w in caught if "different numbers of batches" in str(w.message)]
        assert len(said) == 2 and f"rank {N - 1}'s variables" in said[0], said
    identical_everywhere(model, "sync")
    steps = gtf.allgather_object(int(model.optimizer.iterations))
    assert steps == [2 * (S + 1)] * N, steps  # the last rank's step counter, everywhere
    for w, r in zip(model.weights, reference_sync(2)):
        np.testing.assert_allclose(w.numpy(), r, rtol=1e-5, atol=1e-6,
                                   err_msg=f"sync vs the reference at {w.path}")


class StopOnRank0(keras.callbacks.Callback):
    """EarlyStopping on a rank-local metric, made deterministic."""

    def on_epoch_end(self, epoch, logs=None):
        if R == 0 and epoch == 0:
            self.model.stop_training = True


def check_stop():
    x, y = rank_data(R, S)
    model = make_model()
    took = fit_raises(model, x, y, [gk.EpochAgreementCallback(), StopOnRank0()], 3,
                      "rank(s) [0] stopped training after epoch 1",
                      f"rank(s) {list(range(1, N))} go on")
    print(f"rank {R}: stop on rank 0 raised after {took:.1f} s", flush=True)
    identical_everywhere(model, "stop")  # one epoch, every batch reduced: still in step
    got = gk.allreduce(np.ones(2, np.float32), name="after.stop", op=gk.Sum)
    assert np.array_equal(got.numpy(), np.full(2, N, np.float32)), got  # nothing left pending


try:
    gk.EpochAgreementCallback("zeros")
except ValueError as e:
    assert "uneven_batches" in str(e), str(e)
else:
    raise AssertionError("EpochAgreementCallback('zeros') accepted")
check_equal()
check_uneven()
check_sync()
check_stop()
print(f"rank {R}: keras epoch agreement OK", flush=True)
