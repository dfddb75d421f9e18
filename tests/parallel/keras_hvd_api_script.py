# tests/parallel/keras_hvd_api_script.py — SPMD script (run by test_tensorflow.py
# under mpiexec, 2 and 3 ranks): the Keras-level functions of Horovod 0.28 in
# gradflow.tensorflow.keras — allreduce/allgather/broadcast/reducescatter on
# values vs numpy, load_model round trip (state restored, training continues
# bitwise like the original), PartialDistributedOptimizer (local layers differ
# between ranks, shared ones identical; one step checked against numpy),
# broadcast_global_variables' error; MetricAverageCallback over the
# optimizer's process set. Exits non-zero on failure.
import os
import shutil
import tempfile

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.tensorflow as gtf  # noqa: E402
import gradflow.tensorflow.keras as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()


def close(a, b, what, tol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert np.allclose(a, b, atol=tol, rtol=tol), f"{what}: {a} != {b}"


def identical_everywhere(arrays, what):
    blobs = gtf.allgather_object([np.asarray(a).tobytes() for a in arrays])
    assert all(b == blobs[0] for b in blobs), f"{what}: ranks differ"


def check_values():
    got = hvd.allreduce([1.0 * R, 2.0])
    assert got.dtype == tf.float32, got.dtype  # Python floats become float32, as tf.constant
    close(got, [np.mean(range(N)), 2.0], "keras allreduce average")
    close(hvd.allreduce(np.full(3, R + 1, np.int64), average=False), np.full(3, N * (N + 1) // 2),
          "keras allreduce average=False")
    close(hvd.allreduce(np.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
          np.full(2, float(N)), "keras allreduce scaled")
    close(hvd.allgather(np.full((R + 1, 2), R)), np.concatenate([np.full((r + 1, 2), r)
                                                                 for r in range(N)]),
          "keras allgather")
    close(hvd.broadcast(np.arange(4) + R, N - 1), np.arange(4) + N - 1, "keras broadcast")
    full = np.sum([np.arange(2 * N * 3).reshape(2 * N, 3) * (r + 1) for r in range(N)], 0)
    close(hvd.reducescatter(np.arange(2 * N * 3).reshape(2 * N, 3) * (R + 1), op=hvd.Sum),
          full[2 * R:2 * R + 2], "keras reducescatter")
    try:
        hvd.broadcast_global_variables(0)
    except RuntimeError as e:
        assert "BroadcastGlobalVariablesCallback" in str(e), str(e)
    else:
        raise AssertionError("broadcast_global_variables did not raise")


def train_alike(first, second, x, y, batch_size, what):
    """One more epoch of each on the same data: the same weights to float32
    rounding (at 3+ ranks the ring's summation order follows the fusion
    layout, which follows timing: two runs may differ in the last bits, see
    architecture.md, Reproducibility), and bitwise the same on every rank."""
    for m in (first, second):
        m.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(first.weights, second.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{what}: differs at {b.path}")
    identical_everywhere([w.numpy() for w in first.weights], what)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def data(r, n=16):
    rng = np.random.default_rng(100 + r)
    return rng.normal(size=(n, 5)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)


def check_load_model():
    path = gtf.broadcast_object(os.path.join(tempfile.mkdtemp(), "m.keras") if R == 0 else None)
    model = make_model(1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.AdamW(0.01)), loss="mse")
    x, y = data(R)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    if R == 0:
        model.save(path)
    gtf.join()  # every rank waits for the file
    loaded = hvd.load_model(path, compression=hvd.Compression.fp16)
    assert hvd.is_distributed(loaded.optimizer), type(loaded.optimizer)
    assert type(loaded.optimizer).__name__ == "AdamW", type(loaded.optimizer)
    assert loaded.optimizer.compression is hvd.Compression.fp16
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 4
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), f"optimizer state {b.path} not restored"
    for a, b in zip(loaded.weights, model.weights):
        assert np.array_equal(a.numpy(), b.numpy()), f"weight {b.path} not restored"
    # Training continues as the original would (the loaded one reduces over fp16
    # wire, so compare a third model loaded with the default compression bitwise).
    train_alike(hvd.load_model(path), model, x, y, 8, "loaded model's continued training")
    try:
        hvd.load_model(path, legacy_opts=True)
    except ValueError as e:
        assert "legacy" in str(e), str(e)
    else:
        raise AssertionError("legacy_opts=True did not raise")
    check_custom_optimizer(os.path.join(os.path.dirname(path), "custom.keras"))
    check_plain_saved(os.path.join(os.path.dirname(path), "plain.keras"))
    gtf.join()  # every rank is done with the files
    if R == 0:
        shutil.rmtree(os.path.dirname(path))


def check_plain_saved(path):
    """A model saved with a plain built-in optimizer (a single-process run's
    checkpoint, loaded on rank 0 only before): it comes back wrapped with its
    state. On the TensorFlow backend Keras saves it without a registered name
    and used to bypass load_model's wrappers: ValueError "came back
    unwrapped" (before 2026-11-27)."""
    model = make_model(4)
    model.compile(optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1), loss="mse")
    x, y = data(0)  # the same local training on every rank: the same checkpoint
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    if R == 0:
        model.save(path)
    gtf.join()
    loaded = hvd.load_model(path)
    assert hvd.is_distributed(loaded.optimizer), type(loaded.optimizer)
    assert type(loaded.optimizer).__name__ == "AdamW", type(loaded.optimizer)
    assert int(loaded.optimizer.iterations) == 4, int(loaded.optimizer.iterations)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), f"optimizer state {b.path} not restored"
    # Every rank on the same batches: the average is the local gradient, so
    # the wrapped model goes on exactly as the plain one.
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(loaded.weights, model.weights):
        assert np.allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7), f"continued: {b.path}"
    identical_everywhere([w.numpy() for w in loaded.weights], "plain-saved model after training")


@keras.saving.register_keras_serializable(package="t14")
class HalfSGD(keras.optimizers.SGD):
    """A user's optimizer class: load_model wraps it only when listed."""


def check_custom_optimizer(path):
    model = make_model(3)
    model.compile(optimizer=hvd.DistributedOptimizer(HalfSGD(0.05)), loss="mse")
    x, y = data(R)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    if R == 0:
        model.save(path)
    gtf.join()
    try:  # Keras itself cannot find the class (the wrapper's saved name is unregistered)
        hvd.load_model(path)
    except (TypeError, ValueError) as e:
        assert "HalfSGD" in str(e), str(e)
    else:
        raise AssertionError("an unlisted custom optimizer did not raise")
    try:  # a custom_objects entry taking the optimizer's name: refused, never unwrapped
        hvd.load_model(path, custom_objects={"HalfSGD": HalfSGD})
    except ValueError as e:
        assert "unwrapped" in str(e) and "custom_optimizers" in str(e), str(e)
    else:
        raise AssertionError("an unwrapped optimizer did not raise")
    loaded = hvd.load_model(path, custom_optimizers=[HalfSGD])
    assert hvd.is_distributed(loaded.optimizer) and isinstance(loaded.optimizer, HalfSGD)
    assert int(loaded.optimizer.iterations) == 2


def check_partial_step():
    # One SGD step by hand: shared gradient averaged over ranks; local gradient
    # this rank's own, divided by N (scale_local_gradients, as Horovod).
    shared = keras.layers.Dense(3)
    local = keras.layers.Dense(2)
    shared.build((None, 4))
    local.build((None, 4))
    for layer in (shared, local):
        for v in layer.trainable_weights:
            v.assign(np.ones(v.shape, np.float32))
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.5), local_layers=[local])
    variables = shared.trainable_weights + local.trainable_weights
    grads_of = [[np.full(v.shape, (r + 1) * (i + 1), np.float32) for i, v in enumerate(variables)]
                for r in range(N)]
    opt.apply([tf.constant(g) for g in grads_of[R]], variables)
    for i, v in enumerate(variables):
        mean = np.mean([grads_of[r][i] for r in range(N)], 0)
        want = 1.0 - 0.5 * (mean if i < 2 else grads_of[R][i] / N)
        close(v.numpy(), want, f"partial step variable {i}")


def check_partial_fit():
    model = make_model(2)
    local = model.layers[-1]
    model.compile(optimizer=hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                                             local_layers=local), loss="mse")
    x, y = data(R)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    identical_everywhere([w.numpy() for w in model.layers[0].weights], "shared layer")
    if N > 1:
        kernels = gtf.allgather_object(local.kernel.numpy())
        assert not np.array_equal(kernels[0], kernels[1]), "local layer is identical across ranks"


def check_wrapper_corners():
    """Where the wrapper meets Keras's own machinery (2026-11-27 audit): each
    case failed before its fix."""
    x, y = data(R)
    # An optimizer made on one rank only (an evaluation-only compile) used to
    # shift that rank's Keras auto-names ("sgd_1" against "sgd") and with
    # them the reduction names: the job stalled.
    if R == 0:
        make_model(7).compile(optimizer="sgd", loss="mse")
    model = make_model(3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    identical_everywhere([w.numpy() for w in model.weights], "eval-only optimizer on rank 0")
    # from_config of a wrapped optimizer (a copy) wraps again with the same
    # settings; it used to claim to be distributed and fail at its first step.
    # (The 16-bit wire's rounding depends on how a cycle fused the tensors,
    # so the bitwise comparison below trains in fp32.)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), backward_passes_per_step=2,
                                   op=hvd.Sum)
    copy = type(opt).from_config(opt.get_config())
    assert hvd.is_distributed(copy) and copy.backward_passes_per_step == 2
    assert copy.op == hvd.Sum and copy.gradflow_name != opt.gradflow_name
    fp16 = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.fp16)
    assert type(fp16).from_config(fp16.get_config()).compression is hvd.Compression.fp16
    twin = [make_model(4), make_model(4)]
    for m, o in zip(twin, (copy, opt)):
        m.compile(optimizer=o, loss="mse")
    train_alike(*twin, x, y, 4, "from_config copy")
    # Horovod's order with accumulation: a clear gradflow error (Keras's own
    # named an argument the user never passed).
    try:
        hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                 backward_passes_per_step=2)
    except ValueError as e:
        assert "LossScaleOptimizer(DistributedOptimizer(" in str(e), str(e)
    else:
        raise AssertionError("LossScaleOptimizer inside with backward_passes_per_step=2 accepted")
    # A mixed-precision model saved with its LossScaleOptimizer around the
    # wrapped one loads (it used to be refused as "came back unwrapped").
    path = gtf.broadcast_object(os.path.join(tempfile.mkdtemp(), "mixed.keras") if R == 0 else None)
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = make_model(5)
        mixed.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
        mixed.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        if R == 0:
            mixed.save(path)
        gtf.join()
        loaded = hvd.load_model(path)
        assert hvd.is_distributed(loaded.optimizer.inner_optimizer), type(loaded.optimizer)
        train_alike(loaded, mixed, x, y, 8, "reloaded mixed model")
    finally:
        keras.mixed_precision.set_global_policy(policy)
    gtf.join()
    if R == 0:
        shutil.rmtree(os.path.dirname(path))


def check_metric_average_over_the_optimizers_set():
    """MetricAverageCallback averages over the process set of the model's
    DistributedOptimizer (2 ranks: {0} and {1}; 3: {0, 2} and {1}), plain
    or under a LossScaleOptimizer; process_set= overrides it. Before
    2026-11-29 over all ranks, mixing the two sets' metrics."""
    even = hvd.add_process_set([r for r in range(N) if r % 2 == 0])
    odd = hvd.add_process_set([r for r in range(N) if r % 2 == 1])
    ps = even if R % 2 == 0 else odd
    rng = np.random.default_rng(50 + R)
    x = (rng.normal(size=(16, 5)) * (1 + 10 * R)).astype(np.float32)
    y = rng.normal(size=(16, 2)).astype(np.float32)

    class Last(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.loss = logs["loss"]

    for wrap, average, members in ((lambda o: o, None, ps.ranks),
                                   (keras.optimizers.LossScaleOptimizer, None, ps.ranks),
                                   (lambda o: o, hvd.MetricAverageCallback(
                                       process_set=hvd.global_process_set), list(range(N)))):
        model = make_model(3)
        model.compile(optimizer=wrap(hvd.DistributedOptimizer(keras.optimizers.SGD(0.0),
                                                              process_set=ps)), loss="mse")
        last = Last()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                  callbacks=[average or hvd.MetricAverageCallback(), last])
        own = gtf.allgather_object(float(model.evaluate(x, y, batch_size=8, verbose=0)))
        close(last.loss, np.mean([own[r] for r in members]), f"metric average over {members}",
              tol=1e-5)
    hvd.remove_process_set(odd)
    hvd.remove_process_set(even)


check_values()
check_metric_average_over_the_optimizers_set()
check_wrapper_corners()
check_load_model()
check_partial_step()
check_partial_fit()
print(f"rank {R}: keras hvd api OK", flush=True)
