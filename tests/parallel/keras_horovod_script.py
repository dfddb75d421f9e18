# tests/parallel/keras_horovod_script.py — SPMD script (run by test_tensorflow.py
# under mpiexec at 2 and 3 ranks): Horovod 0.28 parity of the Keras API through
# `gradflow.tensorflow.keras`: signatures, backward_passes_per_step sum/average vs
# a single-process reference, callbacks with Horovod's arguments, clear errors;
# Keras 3's MultiOptimizer wrapped, or wrapping DistributedOptimizers.
import inspect
import os
import tempfile

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

from sklearn.datasets import load_digits  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402
import gradflow.tensorflow.keras as hvd  # noqa: E402  (the alias under test)
from gradflow.tensorflow.keras.callbacks import BestModelCheckpoint  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
B, S = 8, 10                      # per-rank batch, steps per epoch (S even)
X, Y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
Y = Y.astype(np.int32)
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def rank_slice(a, r, start=0):
    """Rank r's rows: its B-row block of every combined batch of B*N rows."""
    return np.concatenate([a[start + s * B * N + r * B: start + s * B * N + (r + 1) * B] for s in range(S)])


XT, YT = rank_slice(X, R), rank_slice(Y, R)
XC, YC = X[:S * B * N], Y[:S * B * N]
XV, YV = rank_slice(X, R, 1000), rank_slice(Y, R, 1000)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10)])


def check_alias_and_signatures():
    assert hvd.DistributedOptimizer is gk.DistributedOptimizer
    assert hvd.callbacks is gk.callbacks and BestModelCheckpoint is gk.BestModelCheckpoint
    assert set(gk.__all__) <= set(dir(hvd)), set(gk.__all__) - set(dir(hvd))
    # Horovod 0.28's positional order and defaults.
    want = [("optimizer", inspect.Parameter.empty), ("name", None), ("device_dense", ""),
            ("device_sparse", ""), ("compression", hvd.Compression.none),
            ("sparse_as_dense", False), ("gradient_predivide_factor", 1.0), ("op", hvd.Average),
            ("backward_passes_per_step", 1), ("average_aggregated_gradients", False),
            ("num_groups", 0), ("groups", None), ("process_set", hvd.global_process_set),
            ("scale_local_gradients", True)]
    params = list(inspect.signature(hvd.DistributedOptimizer).parameters.values())
    got = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert got == want, got
    for cls, names in ((hvd.BroadcastGlobalVariablesCallback, ["root_rank", "device", "local_variables"]),
                       (hvd.MetricAverageCallback, ["device"]),
                       (hvd.BestModelCheckpoint, ["filepath", "monitor", "verbose", "mode", "save_freq"])):
        got = [p.name for p in inspect.signature(cls).parameters.values()
               if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert got == names, (cls, got)
    assert issubclass(hvd.BestModelCheckpoint, keras.callbacks.ModelCheckpoint)


def reference_bpps(init, lr, k, average):
    """One process, the combined batches: gradients of the mean loss summed
    over k batches (divided by k when average), one SGD update every k."""
    ref = make_model(0)
    ref.set_weights(init)
    acc = None
    for s in range(S):
        xb, yb = XC[s * B * N:(s + 1) * B * N], YC[s * B * N:(s + 1) * B * N]
        with tf.GradientTape() as tape:
            loss = LOSS(yb, ref(xb, training=True))
        g = [x.numpy().astype(np.float64) for x in tape.gradient(loss, ref.trainable_variables)]
        acc = g if acc is None else [a + b for a, b in zip(acc, g)]
        if (s + 1) % k == 0:
            for v, a in zip(ref.trainable_variables, acc):
                v.assign(v.numpy() - lr * (a / k if average else a))
            acc = None
    return ref.get_weights()


def check_backward_passes(average):
    k, lr = 2, 0.1
    model = make_model(7)  # same initial weights everywhere
    init = model.get_weights()
    # Horovod positional order: (optimizer, name, device_dense, device_sparse, ...).
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=lr), f"bpps{average}", "", "",
                                   backward_passes_per_step=k, average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss=LOSS)
    gradflow.reset_stats()
    model.fit(XT, YT, batch_size=B, epochs=1, shuffle=False, verbose=0)
    count = gradflow.stats().get("allreduce.count", 0)
    assert 0 < count <= (S // k) * 4, f"backward_passes_per_step={k} made {count} allreduces"
    ws = model.get_weights()
    for i, w in enumerate(ws):
        allw = gradflow.allgather(w[None], name=f"bpps{average}.w{i}")
        assert (allw == allw[0]).all(), "weights differ between ranks"
    want = reference_bpps(init, lr, k, average)
    other = reference_bpps(init, lr, k, not average)
    for w, r, o in zip(ws, want, other):
        assert np.allclose(w, r, atol=2e-5, rtol=1e-4), (average, np.abs(w - r).max())
    # The two semantics really differ here (the check above could not pass for the other).
    assert max(np.abs(r - o).max() for r, o in zip(want, other)) > 1e-3


def check_broadcast_local_variables():
    model = make_model(100 + R)  # different weights on every rank
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0), name="bcast"),
                  loss=LOSS)
    mine = model.get_weights()
    root = [gradflow.broadcast(w, 0, name=f"root.{i}") for i, w in enumerate(mine)]
    local = model.layers[0].kernel   # kernel of the first Dense: weights[0]
    for arg in ([local], local):     # a list or one variable, positionally
        model.set_weights(mine)
        cb = hvd.BroadcastGlobalVariablesCallback(0, "", arg)
        model.fit(XT[:B], YT[:B], batch_size=B, epochs=1, verbose=0, callbacks=[cb])
        got = model.get_weights()  # lr 0: fit changes nothing, the broadcast does
        assert np.array_equal(got[0], mine[0]), "local variable was overwritten"
        for w, r in zip(got[1:], root[1:]):
            assert np.array_equal(w, r), "global variable not broadcast"
    if N > 1:
        allk = gradflow.allgather(got[0][None], name="local.kernel")
        assert not (allk == allk[0]).all(), "local kernels became equal"


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def check_metric_average_and_checkpoint():
    model = make_model(3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="ckpt"),
                  loss=LOSS, metrics=["accuracy"])
    folder = tempfile.mkdtemp()  # private to this rank: only rank 0's gets a file
    raw, avg = Record(), Record()
    ckpt = hvd.BestModelCheckpoint(os.path.join(folder, "best-{epoch}.keras"), "val_loss", 0,
                                   "min", "epoch")
    model.fit(XT, YT, batch_size=B, epochs=3, shuffle=False, verbose=0,
              validation_data=(XV, YV),
              callbacks=[hvd.BroadcastGlobalVariablesCallback(0), raw,
                         hvd.MetricAverageCallback(""), avg, ckpt])
    for e in range(3):
        for key in ("loss", "val_loss", "accuracy"):
            per_rank = gradflow.allgather(np.array([raw.logs[e][key]]), name=f"m{e}{key}")
            assert abs(avg.logs[e][key] - per_rank.mean()) < 1e-6, (key, avg.logs[e][key], per_rank)
    vals = [lg["val_loss"] for lg in avg.logs]
    saved = [e + 1 for e in range(3) if vals[e] == min(vals[:e + 1])]
    want = os.path.join(folder, f"best-{saved[-1]}.keras")
    assert ckpt.last_saved == want and ckpt.best == min(vals), (ckpt.last_saved, want, ckpt.best)
    files = sorted(f for f in os.listdir(folder))
    if R == 0:
        assert files == sorted(f"best-{e}.keras" for e in saved), files
        assert type(keras.models.load_model(want).optimizer).__name__ == "SGD"
    else:
        assert files == [], f"rank {R} wrote {files}"


def expect_value_error(what, fn, *words):
    try:
        fn()
    except ValueError as e:
        assert all(w in str(e) for w in words), str(e)
    else:
        raise AssertionError(f"{what} did not raise")


def check_errors():
    sgd = keras.optimizers.SGD(0.1)
    expect_value_error("num_groups", lambda: hvd.DistributedOptimizer(sgd, num_groups=2), "num_groups")
    expect_value_error("groups", lambda: hvd.DistributedOptimizer(sgd, groups=[[0]]), "groups")

    class Subset:  # not a ProcessSet: refused, never taken for the global set
        ranks = [0]
        process_set_id = 1

    expect_value_error("process_set", lambda: hvd.DistributedOptimizer(sgd, process_set=Subset()),
                       "process_set", "ProcessSet")
    # A set that was never registered (add_process_set) is refused on every rank.
    expect_value_error("process_set", lambda: hvd.DistributedOptimizer(
        sgd, process_set=hvd.ProcessSet([0])), "not registered")
    hvd.DistributedOptimizer(sgd, process_set=hvd.global_process_set)  # the global set is fine
    expect_value_error("bpps", lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0),
                       "backward_passes_per_step")

def multi_optimizer(wrap=lambda o: o):
    return keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(
        wrap(keras.optimizers.SGD(0.1)), {"head/.*": wrap(keras.optimizers.Adam(0.01))}))


def check_multi_optimizer():
    """Keras 3's MultiOptimizer (a rate per layer) wrapped by DistributedOptimizer
    (before: AttributeError at the first step, from the hyperparameter check
    reading its learning rate), or wrapping DistributedOptimizers, traced and
    eager: equal to the plain MultiOptimizer on the combined batches, ranks
    bitwise identical. With backward_passes_per_step > 1 around it: ValueError."""
    def train(opt, x, y, batch, eager):
        keras.utils.set_random_seed(11)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10, name="head")])
        model.compile(optimizer=opt, loss=LOSS, run_eagerly=eager)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()

    for eager in (False, True):
        want = train(multi_optimizer(), XC, YC, B * N, eager)
        for opt in (hvd.DistributedOptimizer(multi_optimizer()),
                    multi_optimizer(lambda o: hvd.DistributedOptimizer(o))):
            ws = train(opt, XT, YT, B, eager)
            for i, (w, r) in enumerate(zip(ws, want)):
                assert np.allclose(w, r, atol=2e-6), ("multi", eager, np.abs(w - r).max())
                allw = gradflow.allgather(w[None], name=f"multi.{eager}.{i}")
                assert (allw == allw[0]).all(), "multi: weights differ between ranks"
    expect_value_error("multi bpps", lambda: hvd.DistributedOptimizer(
        multi_optimizer(), backward_passes_per_step=2), "MultiOptimizer", "inside it")


check_alias_and_signatures()
check_errors()
check_backward_passes(average=False)
check_backward_passes(average=True)
check_broadcast_local_variables()
check_metric_average_and_checkpoint()
check_multi_optimizer()
gradflow.barrier()
print(f"rank {R}: keras horovod OK", flush=True)
