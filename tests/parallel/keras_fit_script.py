# tests/parallel/keras_fit_script.py — SPMD script (run by test_tensorflow.py under
# mpiexec): Keras 3 model.fit with gradflow.keras.DistributedOptimizer on sklearn
# digits against single-process training on the combined batches, and every
# callback checked by the values it produces. Exits non-zero on failure.
import glob
import hashlib
import os
import re
import tempfile

from _tf_common import keras  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

from sklearn.datasets import load_digits  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402

gk.init()
R, N = gk.rank(), gk.size()
B, S = 8, 10                      # per-rank batch, steps per epoch
X, Y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
Y = Y.astype(np.int32)


def rank_slice(a, r, start=0):
    """Rank r's rows: its B-row block of every combined batch of B*N rows."""
    return np.concatenate([a[start + s * B * N + r * B: start + s * B * N + (r + 1) * B] for s in range(S)])


XT, YT = rank_slice(X, R), rank_slice(Y, R)
XC, YC = X[:S * B * N], Y[:S * B * N]     # the combined batches, in order
XV, YV = rank_slice(X, R, 1000), rank_slice(Y, R, 1000)


def make_model(hidden=32, seed=None):
    keras.utils.set_random_seed(1234 + R if seed is None else seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10)])


def compile_(model, opt, **kw):
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], **kw)


def weights_hash(model):
    h = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights()))
    return np.frombuffer(h.digest(), np.uint8)


def assert_same_everywhere(model, what):
    hashes = gradflow.allgather(weights_hash(model)[None], name=f"hash.{what}")
    assert (hashes == hashes[0]).all(), f"{what}: weights differ between ranks"


class Record(keras.callbacks.Callback):
    """Copies logs at epoch end and (optionally) the lr at every batch start."""

    def __init__(self):
        super().__init__()
        self.logs, self.lrs, self.ratios = [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.ratios.append(getattr(self.model.optimizer, "sparse_ratio", None))

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def check_fit_matches_reference(tmp):
    model = make_model()
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1))
    compile_(model, opt)
    raw, avg = Record(), Record()
    ckpt = gk.BestModelCheckpoint(os.path.join(tmp, "best-{epoch}.keras"), monitor="val_loss")
    callbacks = [gk.BroadcastGlobalVariablesCallback(0), raw, gk.MetricAverageCallback(), avg, ckpt]
    # Rank 0's initial weights, for the reference (the callback broadcasts them).
    root_init = [gradflow.broadcast(np.asarray(w), 0, name=f"init.{i}")
                 for i, w in enumerate(make_model().get_weights())]
    model.fit(XT, YT, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=callbacks,
              validation_data=(XV, YV))
    assert_same_everywhere(model, "fit")
    # Averaged metrics: the mean of every rank's raw values.
    for e in range(2):
        for k in ("loss", "accuracy", "val_loss", "val_accuracy"):
            per_rank = gradflow.allgather(np.array([raw.logs[e][k]], np.float64), name=f"m.{e}.{k}")
            assert abs(avg.logs[e][k] - per_rank.mean()) < 1e-6, (k, avg.logs[e][k], per_rank)
    # Checkpoint: the best epoch by averaged val_loss, written by rank 0 only, atomically.
    best_epoch = int(np.argmin([lg["val_loss"] for lg in avg.logs])) + 1
    want = os.path.join(tmp, f"best-{best_epoch}.keras")
    assert ckpt.last_saved == want, (ckpt.last_saved, want)
    gradflow.barrier()
    assert os.path.exists(want), want
    assert not glob.glob(os.path.join(tmp, ".tmp-*")), os.listdir(tmp)
    if R == 0:
        loaded = keras.models.load_model(want)
        assert type(loaded.optimizer).__name__ == "SGD", type(loaded.optimizer)
        # Reference: one process, fresh model from rank 0's initial weights, the combined batches.
        ref = make_model(seed=99)
        ref.set_weights(root_init)
        compile_(ref, keras.optimizers.SGD(learning_rate=0.1))
        ref.fit(XC, YC, batch_size=B * N, epochs=2, shuffle=False, verbose=0)
        for w, r in zip(model.get_weights(), ref.get_weights()):
            assert np.allclose(w, r, atol=1e-5, rtol=1e-4), np.abs(w - r).max()
    gradflow.barrier()


def check_backward_passes():
    model = make_model(seed=7)  # same initial weights everywhere
    init = model.get_weights()
    compile_(model, gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1),
                                            backward_passes_per_step=2, name="bpps",
                                            average_aggregated_gradients=True))
    gradflow.reset_stats()
    model.fit(XT, YT, batch_size=B, epochs=1, shuffle=False, verbose=0)
    assert_same_everywhere(model, "bpps")
    count = gradflow.stats().get("allreduce.count", 0)
    assert count <= (S // 2) * 4 + 2, f"backward_passes_per_step=2 made {count} allreduces"
    if R == 0:
        ref = make_model(seed=7)
        ref.set_weights(init)
        compile_(ref, keras.optimizers.SGD(learning_rate=0.1, gradient_accumulation_steps=2))
        ref.fit(XC, YC, batch_size=B * N, epochs=1, shuffle=False, verbose=0)
        for w, r in zip(model.get_weights(), ref.get_weights()):
            assert np.allclose(w, r, atol=1e-5, rtol=1e-4), np.abs(w - r).max()


def check_lr_warmup():
    model = make_model()
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9), name="warm")
    compile_(model, opt)
    rec = Record()
    warm = gk.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    model.fit(XT, YT, batch_size=B, epochs=3, shuffle=False, verbose=0,
              callbacks=[gk.BroadcastGlobalVariablesCallback(0), warm, rec])
    want = [0.1 / N * ((e + b / S + 1 / S) * (N - 1) / 2 + 1) for e in range(2) for b in range(S)]
    want += [want[-1]] * S  # after warmup the rate stays where it ended (0.1)
    assert np.allclose(rec.lrs, want, rtol=1e-6), (rec.lrs, want)
    assert abs(want[-1] - 0.1) < 1e-9 and abs(rec.logs[-1]["lr"] - 0.1) < 1e-7
    assert_same_everywhere(model, "warmup")


class MomentumProbe(keras.callbacks.Callback):
    """Placed before and after the schedule callback: records momentum buffers."""

    def __init__(self, store):
        super().__init__()
        self.store = store

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        if not opt.built:
            opt.build(self.model.trainable_variables)
        self.store.append((float(keras.ops.convert_to_numpy(opt.learning_rate)),
                           [keras.ops.convert_to_numpy(m).copy() for m in opt.momentums]))


def check_lr_schedule():
    model = make_model()
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9), name="sched")
    compile_(model, opt)
    before, after = [], []
    sched = gk.LearningRateScheduleCallback(0.1, lambda e: 0.5 ** e, start_epoch=1, end_epoch=3)
    model.fit(XT, YT, batch_size=B, epochs=4, shuffle=False, verbose=0,
              callbacks=[MomentumProbe(before), sched, MomentumProbe(after)])
    lrs = [a[0] for a in after]
    want = [0.1] * S + [0.05] * S + [0.025] * S + [0.025] * S
    assert np.allclose(lrs, want), lrs
    for i, ((lr0, m0), (lr1, m1)) in enumerate(zip(before, after)):
        for a, b in zip(m0, m1):  # momentum correction: buffers scaled by new/old
            assert np.allclose(b, a * (lr1 / lr0), atol=1e-7), (i, lr0, lr1)
    changed = [i for i, (b, a) in enumerate(zip(before, after)) if b[0] != a[0]]
    assert changed == [S, 2 * S], changed
    # A float multiplier is exponential decay from start_epoch (Horovod 0.28:
    # multiplier ** (epoch - start_epoch)); it used to be a constant factor.
    const = gk.LearningRateScheduleCallback(0.2, 0.5, start_epoch=1, end_epoch=3,
                                            momentum_correction=False)
    rec = Record()
    model.fit(XT, YT, batch_size=B, epochs=4, shuffle=False, verbose=0, callbacks=[const, rec])
    want = [0.025] * S + [0.2] * S + [0.1] * S + [0.1] * S  # epoch 0: the previous fit's last rate
    assert np.allclose(rec.lrs, want), rec.lrs


def check_momentum_correction_by_optimizer():
    """Momentum correction scales only buffers of an optimizer with a
    `momentum` (as Horovod): Adam trains the same with or without it (its
    first moments were scaled before); under mixed precision the
    LossScaleOptimizer is looked through, so SGD's buffers are scaled."""
    def train(make_opt, correction):
        model = make_model(seed=7)
        compile_(model, gk.DistributedOptimizer(make_opt(), name="mc"))
        sched = gk.LearningRateScheduleCallback(0.01, lambda e: 0.5 ** e, start_epoch=1,
                                                momentum_correction=correction)
        model.fit(XT, YT, batch_size=B, epochs=3, shuffle=False, verbose=0,
                  callbacks=[gk.BroadcastGlobalVariablesCallback(0), sched])
        assert_same_everywhere(model, "momentum correction")
        return weights_hash(model)

    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    assert (train(adam, True) == train(adam, False)).all(), "Adam's moments were rescaled"
    model = make_model(seed=7)
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    compile_(model, gk.DistributedOptimizer(scaled, name="mc.lso"))

    class Inner(MomentumProbe):
        def on_train_batch_begin(self, batch, logs=None):
            opt = self.model.optimizer
            if not opt.built:
                opt.build(self.model.trainable_variables)
            self.store.append([keras.ops.convert_to_numpy(m).copy()
                               for m in opt.inner_optimizer.momentums])

    before, after = [], []
    sched = gk.LearningRateScheduleCallback(0.1, lambda e: 0.5 ** e, start_epoch=1)
    model.fit(XT, YT, batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[Inner(before), sched, Inner(after)])
    b, a = before[S], after[S]  # the first batch of epoch 1, where the rate halves
    assert all(np.allclose(y, x * 0.5, atol=1e-7) for x, y in zip(b, a)), \
        "LossScaleOptimizer: SGD's momentum buffers were not scaled at the rate change"


def check_metric_average():
    """MetricAverageCallback averages vector metrics too (Horovod allreduces
    every log value); ranks that log different keys raise ValueError on every
    rank, naming them."""
    model = make_model(seed=9)
    compile_(model, gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="avg"))
    logs = {"loss": float(R), "per_class": np.arange(3.0) * (R + 1), "note": "text"}
    cb = gk.MetricAverageCallback()
    cb.set_model(model)
    cb.on_epoch_end(0, logs)
    assert logs["loss"] == (N - 1) / 2, logs
    assert np.allclose(logs["per_class"], np.arange(3.0) * (N + 1) / 2), logs
    assert logs["note"] == "text"
    odd = {"loss": 1.0, **({"val_loss": 2.0} if R == 0 else {})}
    try:
        cb.on_epoch_end(1, odd)
    except ValueError as e:
        assert "the ranks log different metrics" in str(e) and "val_loss" in str(e), e
    else:
        raise AssertionError("different keys were averaged")


def check_sparse_warmup():
    model = make_model()
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1), name="sparse")
    compile_(model, opt)
    rec = Record()
    gradflow.reset_stats()
    sparse_steps = []

    class Stats(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            st = gradflow.stats()
            sparse_steps.append(st.get("sparse.steps", 0) + st.get("sparse.dense_warmup_steps", 0))

    model.fit(XT, YT, batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[gk.BroadcastGlobalVariablesCallback(0), gk.SparseWarmupCallback(1, 0.5),
                         rec, Stats()])
    assert rec.ratios == [1.0, 0.5], rec.ratios
    assert sparse_steps[0] == 0 and sparse_steps[1] > 0, sparse_steps
    assert_same_everywhere(model, "sparse")


def check_xla():
    model = make_model()
    compile_(model, gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="xla"), jit_compile=True)
    try:
        model.fit(XT[:B], YT[:B], batch_size=B, epochs=1, verbose=0)
    except Exception as e:
        assert "cannot run under XLA" in str(e), str(e)
    else:
        raise AssertionError("XLA fit did not raise")
    compile_(model, gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="xla2"), jit_compile=True)
    model.fit(XT[:B], YT[:B], batch_size=B, epochs=1, verbose=0,
              callbacks=[gk.BroadcastGlobalVariablesCallback(0)])  # the callback turns XLA off
    assert model.jit_compile is False


def check_mismatched_models():
    model = make_model(hidden=32 + R)
    compile_(model, gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="mismatch"))
    for callbacks in ([gk.BroadcastGlobalVariablesCallback(0)], []):
        try:
            model.fit(XT[:B], YT[:B], batch_size=B, epochs=1, verbose=0, callbacks=callbacks)
        except Exception as e:
            msg = str(e)
            assert "mismatched" in msg and "rank 0" in msg and "rank 1" in msg, msg
            # Without the callback the first mismatched gradient the core sees is
            # named; inside fit the last layer's is submitted first (overlap.py).
            assert ("BroadcastGlobalVariablesCallback" in msg if callbacks
                    else re.search(r"'mismatch\.[0-3]'", msg)), msg
        else:
            raise AssertionError("mismatched models did not raise")


tmp = gradflow.mpi_comm().bcast(tempfile.mkdtemp() if R == 0 else None, root=0)
check_fit_matches_reference(tmp)
check_backward_passes()
check_lr_warmup()
check_lr_schedule()
check_momentum_correction_by_optimizer()
check_metric_average()
check_sparse_warmup()
check_xla()
if N > 1:
    check_mismatched_models()
print(f"rank {R}: keras OK", flush=True)
