# sync_bn_keras_sets_script.py — SPMD, 3 or 4 ranks: SyncBatchNormalization's
# process_set=. Two disjoint sets (3 ranks: {0, 2} and the one-rank {1};
# 4 ranks: {0, 2} and {1, 3}) whose data differ in scale: each set's layer
# equals keras BatchNormalization on the concatenation of its own members'
# rows (output, input / gamma / beta gradients, moving statistics; eager and
# in tf.function), members end bitwise alike; a layer only one set has does
# not wait for the other set; a non-member raises ValueError in training and
# runs inference alone. Before: every layer pooled all ranks' statistics
# (output off by up to 2.45 at 4 ranks), and process_set= was refused.
import hashlib

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow  # noqa: E402
import gradflow.keras as gk  # noqa: E402

gk.init()
R, N = gk.rank(), gk.size()
assert N >= 3, "run on 3 or 4 ranks"
TOL = 1e-10  # float64


def close(a, b, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    err = np.abs(a - b).max() if b.size else 0.0
    assert err <= TOL * max(1.0, np.abs(b).max()), f"{what}: max abs difference {err}"


def step(layer, x, g):
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = layer(xt, training=True)
        loss = tf.reduce_sum(out * g)
    return [out] + tape.gradient(loss, [xt, layer.gamma, layer.beta])


sets = [[r for r in range(N) if r % 2 == 0], [r for r in range(N) if r % 2 == 1]]
handles = [gradflow.add_process_set(ranks) for ranks in sets]
mine_ranks, mine, other = sets[R % 2], handles[R % 2], handles[1 - R % 2]
me = mine_ranks.index(R)
sizes = [3 + 2 * r for r in mine_ranks]  # this set's local batch sizes, in set order
lo, hi = sum(sizes[:me]), sum(sizes[:me + 1])
shift = 0.0 if R % 2 == 0 else 50.0  # pooled statistics would show

for traced in (False, True):
    kw = dict(axis=-1, momentum=0.8, epsilon=1e-3, dtype="float64")
    ref = keras.layers.BatchNormalization(**kw)
    sbn = gk.SyncBatchNormalization(process_set=mine, **kw)
    assert sbn.process_set is mine
    rng = np.random.default_rng(5 + R % 2)  # the same data on every member of a set
    run_ref = tf.function(lambda x, g: step(ref, x, g)) if traced else (lambda x, g: step(ref, x, g))
    run_sbn = tf.function(lambda x, g: step(sbn, x, g)) if traced else (lambda x, g: step(sbn, x, g))
    what = f"set {mine_ranks} traced={traced}"
    for i in range(2):
        X = rng.standard_normal((sum(sizes), 3, 4)) * 2 + shift
        G = rng.standard_normal((sum(sizes), 3, 4))
        out_r, gx_r, gg_r, gb_r = [t.numpy() for t in run_ref(X, G)]
        out, gx, gg, gb = [t.numpy() for t in run_sbn(X[lo:hi], G[lo:hi])]
        close(out, out_r[lo:hi], f"{what} step {i} output")
        close(gx, gx_r[lo:hi], f"{what} step {i} input grad")
        # gamma/beta: this rank's share; the sum over the set is the set's gradient
        close(gradflow.allreduce(gg, op=gradflow.Sum, process_set=mine), gg_r, f"{what} gamma grad")
        close(gradflow.allreduce(gb, op=gradflow.Sum, process_set=mine), gb_r, f"{what} beta grad")
        close(sbn.moving_mean.numpy(), ref.moving_mean.numpy(), f"{what} moving_mean")
        close(sbn.moving_variance.numpy(), ref.moving_variance.numpy(), f"{what} moving_var")
    stats = np.concatenate([sbn.moving_mean.numpy(), sbn.moving_variance.numpy()])
    digest = np.frombuffer(hashlib.sha256(stats.tobytes()).digest(), np.uint8)[None].copy()
    every = gradflow.allgather(digest, process_set=mine)
    assert (every == every[0]).all(), f"{what}: members' moving statistics differ"

# Only the even set's model has this layer; the odd set does not take part.
if R % 2 == 0:
    only = gk.SyncBatchNormalization(process_set=mine, dtype="float64")
    step(only, np.arange(12.0).reshape(4, 3) * (R + 1), np.ones((4, 3)))
else:  # a non-member raises in training, before communicating ...
    foreign = gk.SyncBatchNormalization(process_set=other, dtype="float64")
    try:
        foreign(np.ones((2, 3)), training=True)
        raise AssertionError("a non-member ran the layer in training mode")
    except ValueError as e:
        assert "not a member" in str(e), e
    # ... and runs inference alone (moving statistics 0 and 1)
    close(foreign(np.ones((2, 3)), training=False).numpy(), np.ones((2, 3)) / np.sqrt(1 + 1e-3),
          "non-member inference")
try:
    gk.SyncBatchNormalization(process_set=[0, 1])
    raise AssertionError("a list was accepted as process_set")
except ValueError as e:
    assert "process_set must be" in str(e), e
gradflow.barrier()
if R == 0:
    print(f"keras sync batch norm process sets OK on {N} ranks", flush=True)
