# sync_bn_keras_script.py — SPMD: gradflow.keras.SyncBatchNormalization
# (= gradflow.tensorflow.SyncBatchNormalization) against keras BatchNormalization
# on the concatenated global batch (every rank rebuilds every rank's data):
# output, moving statistics and input / gamma / beta gradients, eager and in
# tf.function, equal / unequal / empty local batches, fp32 and fp64, a mask;
# inference mode; then model.fit with gradflow.keras.DistributedOptimizer
# against single-process training. Backend: KERAS_BACKEND (tensorflow default).
import hashlib

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

from sklearn.datasets import load_digits  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402
import gradflow.tensorflow as hvd  # noqa: E402

gk.init()
R, N = gk.rank(), gk.size()
TOL = {"float32": 2e-5, "float64": 1e-11}
assert hvd.SyncBatchNormalization is gk.SyncBatchNormalization
BACKEND = keras.backend.backend()
if BACKEND == "torch":  # Keras's torch backend hands the layers float32 inputs even with
    TOL["float64"] = TOL["float32"]  # dtype="float64" (the reference layer too)


def ok(what):
    if R == 0:
        print(f"ok {what} (size {N})", flush=True)


def close(a, b, what, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    if b.size:
        err = np.abs(a - b).max()
        scale = max(1.0, np.abs(b).max())
        assert err <= tol * scale, f"{what}: max abs difference {err} (tolerance {tol * scale})"


def same_on_every_rank(arrays, what):
    h = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).digest()
    every = gradflow.allgather(np.frombuffer(h, np.uint8)[None].copy(), name=f"hash.{what}")
    assert (every == every[0]).all(), f"{what}: differs between ranks"


def layouts():
    yield [4] * N
    yield [2 + 3 * r for r in range(N)]
    if N > 1:
        yield [3 + r for r in range(N - 1)] + [0]


def bounds(sizes, r=R):
    start = sum(sizes[:r])
    return start, start + sizes[r]


def to_np(t):
    return keras.ops.convert_to_numpy(t)


def value_and_grads(layer, x, g, mask=None):
    """Output and gradients (input, gamma, beta) of sum(layer(x) * g), training."""
    if BACKEND == "torch":
        import torch
        xt = torch.tensor(x, requires_grad=True)
        out = layer(xt, training=True, mask=None if mask is None else torch.tensor(mask))
        (out * torch.tensor(g)).sum().backward()
        grads = [xt.grad, layer.gamma.value.grad, layer.beta.value.grad]
        res = [to_np(out.detach())] + [t.detach().numpy().copy() for t in grads]
        layer.gamma.value.grad = layer.beta.value.grad = None
        return res
    return [to_np(t) for t in tf_step(layer, x, g, mask)]


def tf_step(layer, x, g, mask=None):
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = layer(xt, training=True, mask=None if mask is None else tf.convert_to_tensor(mask))
        loss = tf.reduce_sum(out * g)
    return [out] + tape.gradient(loss, [xt, layer.gamma, layer.beta])


def check_layer(tail, dtype, sizes, axis=-1, traced=False, masked=False, steps=2):
    """`steps` training calls of SyncBatchNormalization on this rank's rows
    against BatchNormalization on all rows; then one inference call."""
    total = sum(sizes)
    lo, hi = bounds(sizes)
    kw = dict(axis=axis, momentum=0.8, epsilon=1e-3, dtype=dtype)
    ref, sbn = keras.layers.BatchNormalization(**kw), gk.SyncBatchNormalization(**kw)
    ref.build((None, *tail)), sbn.build((None, *tail))
    rng = np.random.default_rng(11)
    channels = (None, *tail)[axis]
    gamma, beta = rng.uniform(0.5, 1.5, channels), rng.standard_normal(channels)
    for layer in (ref, sbn):
        layer.gamma.assign(gamma.astype(dtype)), layer.beta.assign(beta.astype(dtype))
    run_ref, run_sbn = value_and_grads, value_and_grads
    if traced:  # the tf.function path: collectives become numpy_function nodes
        step_ref = tf.function(lambda x, g: tf_step(ref, x, g))
        step_sbn = tf.function(lambda x, g: tf_step(sbn, x, g))
        run_ref = lambda layer, x, g, mask=None: [to_np(t) for t in step_ref(x, g)]  # noqa: E731
        run_sbn = lambda layer, x, g, mask=None: [to_np(t) for t in step_sbn(x, g)]  # noqa: E731
    what = f"{tail} {dtype} axis={axis} sizes={sizes} traced={traced} masked={masked}"
    for step in range(steps):
        X = (rng.standard_normal((total, *tail)) * 3 + 10).astype(dtype)
        G = rng.standard_normal((total, *tail)).astype(dtype)
        M = rng.uniform(size=(total, *tail[:-1])) < 0.7 if masked else None
        out_r, gx_r, gg_r, gb_r = run_ref(ref, X, G, M)
        out, gx, gg, gb = run_sbn(sbn, X[lo:hi], G[lo:hi], None if M is None else M[lo:hi])
        tol = TOL[dtype]
        assert out.dtype == np.dtype(dtype)
        close(out, out_r[lo:hi], f"{what} step {step} output", tol)
        close(gx, gx_r[lo:hi], f"{what} step {step} input grad", tol)
        # gamma/beta: this rank's share; the sum over ranks is the global gradient
        close(gradflow.allreduce(gg, op=gradflow.Sum), gg_r, f"{what} gamma grad", tol)
        close(gradflow.allreduce(gb, op=gradflow.Sum), gb_r, f"{what} beta grad", tol)
        close(to_np(sbn.moving_mean), to_np(ref.moving_mean), f"{what} moving_mean", tol)
        close(to_np(sbn.moving_variance), to_np(ref.moving_variance), f"{what} moving_var", tol)
        same_on_every_rank([to_np(sbn.moving_mean), to_np(sbn.moving_variance)], "moving stats")
    # inference uses the moving statistics and needs no peer: one rank alone runs it
    if R == N - 1:
        X = (rng.standard_normal((total, *tail)) * 2).astype(dtype)
        close(to_np(sbn(X[lo:hi], training=False)), to_np(ref(X, training=False))[lo:hi],
              f"{what} inference", TOL[dtype])
    gradflow.barrier()


for dtype in ("float32", "float64"):
    for sizes in layouts():
        check_layer((5,), dtype, sizes)
        check_layer((3, 2, 4), dtype, sizes)
    ok(f"matches keras BatchNormalization {dtype}")
sizes = [2 + r for r in range(N)]
check_layer((4, 3), "float64", sizes, axis=1)
check_layer((6, 3), "float64", sizes, masked=True)
ok("axis=1 and masked inputs")
if BACKEND == "tensorflow":
    check_layer((3, 2, 4), "float32", sizes, traced=True, steps=3)
    if N > 1:  # a rank with an empty batch, traced
        check_layer((5,), "float64", [3 + 2 * r for r in range(N - 1)] + [0], traced=True)
    ok("inside tf.function")
try:
    gk.SyncBatchNormalization(fused=True)
    raise AssertionError("fused=True accepted")
except ValueError as e:
    assert "fused=True" in str(e)
layer = gk.SyncBatchNormalization(momentum=0.7)
assert layer.name.startswith("sync_batch_normalization")
clone = gk.SyncBatchNormalization.from_config(layer.get_config())
assert type(clone) is gk.SyncBatchNormalization and clone.momentum == 0.7
ok("constructor and config")

# model.fit with DistributedOptimizer, unequal local batches (same number of
# steps), against single-process training on the global batches with loss =
# mean over ranks of each rank's mean loss (what averaging gradients optimizes)
X, Y = load_digits(return_X_y=True)
X, Y = (X / 16.0).astype(np.float32), Y.astype(np.int32)
B = [6 + 2 * r for r in range(N)]   # rank r's batch size
S = 5                                # steps per epoch
GB = sum(B)
starts = [sum(B[:r]) for r in range(N)]
XT = np.concatenate([X[s * GB + starts[R]: s * GB + starts[R] + B[R]] for s in range(S)])
YT = np.concatenate([Y[s * GB + starts[R]: s * GB + starts[R] + B[R]] for s in range(S)])


def make_model(bn):
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(16), bn(momentum=0.9),
                             keras.layers.Activation("relu"), keras.layers.Dense(10)])


loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model = make_model(gk.SyncBatchNormalization)
model.compile(optimizer=gk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
              loss=loss_fn, jit_compile=False)
model.fit(XT, YT, batch_size=B[R], epochs=2, shuffle=False, verbose=0)
same_on_every_rank([np.asarray(w) for w in model.get_weights()], "fit weights")

ref = make_model(keras.layers.BatchNormalization)
opt = keras.optimizers.SGD(0.1, momentum=0.9)
for epoch in range(2):
    for s in range(S):
        xb, yb = X[s * GB:(s + 1) * GB], Y[s * GB:(s + 1) * GB]
        if BACKEND == "torch":
            import torch
            out = ref(torch.tensor(xb), training=True)
            loss = sum(loss_fn(torch.tensor(yb[a:a + b]), out[a:a + b])
                       for a, b in zip(starts, B)) / N
            ref.zero_grad()
            loss.backward()
            grads = [v.value.grad for v in ref.trainable_variables]
        else:
            with tf.GradientTape() as tape:
                out = ref(xb, training=True)
                loss = tf.add_n([loss_fn(yb[a:a + b], out[a:a + b])
                                 for a, b in zip(starts, B)]) / N
            grads = tape.gradient(loss, ref.trainable_variables)
        opt.apply(grads, ref.trainable_variables)
for w, w_ref, v in zip(model.get_weights(), ref.get_weights(), ref.weights):
    close(w, w_ref, f"fit: {v.path}", 1e-5)
ok("model.fit with DistributedOptimizer matches single process")
