# tests/parallel/tf_tape_names_script.py — SPMD script (run by
# test_tensorflow.py::test_tf_default_named_tapes_keep_their_own_residuals
# under mpiexec, 2 and 3 ranks; the test sets GRADFLOW_SPARSE_CHUNK=16 and
# no CSC warm-up). Two DistributedGradientTapes left at their default name
# reduce different variables (a GAN's two models) with sparse_ratio, eagerly
# and in tf.function: each must keep its own CSC residual (Note [Default
# tape names] in gradflow/tensorflow/gradient_tape.py). Checked: bitwise
# equal to the same run with explicit names, never more sent than the true
# gradient sum (error feedback adds nothing), ranks bitwise identical; a
# watched tensor's tape keeps one name from step to step. Before 2026-11-28
# both tapes were named "DistributedGradientTape" and one tape's gradients
# came out 39x their true sum. Also: a variable freed on some ranks
# only does not shift the names; Keras fine-tuning with CSC (a layer
# frozen between fits) keeps each gradient under its variable's name.
# Exits non-zero on failure.
import gc

import numpy as np

from _tf_common import keras, tf  # first: sets TensorFlow up before it loads
import gradflow.keras as gk
import gradflow.tensorflow as gtf
from gradflow.tensorflow import gradient_tape

gtf.init()
R, N = gtf.rank(), gtf.size()
STEPS, SCALES = 8, (1.0, 100.0)  # tape B's gradients 100x tape A's


def variables(seed):
    rng = np.random.default_rng(seed)  # the same values on every rank
    return [tf.Variable(rng.standard_normal((64, 4)).astype(np.float32)) for _ in SCALES]


def reduced(var, scale, name):
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(var * var) * scale * (R + 1)
    kw = {} if name is None else {"name": name}
    return gtf.DistributedGradientTape(t, sparse_ratio=0.25, **kw).gradient(loss, [var])[0]


def train(vs, names, graph):
    """STEPS steps of both tapes (variables unchanged: the same gradients
    each step); returns each tape's sum of reduced gradients."""
    steps = [lambda v=v, s=s, n=n: reduced(v, s, n) for v, s, n in zip(vs, SCALES, names)]
    if graph:
        steps = [tf.function(f) for f in steps]
    totals = [np.zeros((64, 4), np.float32) for _ in vs]
    for _ in range(STEPS):
        for k, f in enumerate(steps):
            totals[k] += f().numpy()
    return totals


for graph in (False, True):
    mode = "tf.function" if graph else "eager"
    default = train(variables(1), (None, None), graph)
    named = train(variables(1), (f"A.{mode}", f"B.{mode}"), graph)
    mean_rank = np.mean(np.arange(1, N + 1))
    for k, (d, n, v, s) in enumerate(zip(default, named, variables(1), SCALES)):
        assert np.array_equal(d, n), (mode, k, np.abs(d - n).max())
        true = STEPS * 2 * v.numpy() * s * mean_rank
        ratio = float(np.abs(d).sum() / np.abs(true).sum())
        assert 0.5 < ratio <= 1.0 + 1e-5, (mode, k, ratio)  # sent <= the true sum
        rows = gtf.allgather(tf.reshape(tf.constant(d), [1, -1])).numpy()
        assert all(np.array_equal(rows[0], rows[r]) for r in range(N)), (mode, k)

# A variable freed on some ranks only (rank 0 keeps a reference, as a logger
# might) and a new one made: its id may be reused on some ranks and not on
# others; the new variable's tape must get the same name on every rank (a
# name table keyed by ids alone stalled here: 'DistributedGradientTape1.0'
# missing on rank 0).
keep = []
reused = 0
for round_ in range(12):
    old = tf.Variable(np.ones(3, np.float32))
    old_id = id(old)
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(old * (R + 1.0))
    gtf.DistributedGradientTape(t).gradient(loss, [old])
    if R == 0:
        keep.append(old)
    del old, t
    gc.collect()
    new = tf.Variable(np.ones(3, np.float32))
    reused += id(new) == old_id
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(new * (R + 1.0))
    (g,) = gtf.DistributedGradientTape(t).gradient(loss, [new])
    assert np.allclose(g.numpy(), (N + 1) / 2.0), g
    del new, t
    gc.collect()
print(f"rank {R}: {reused} of 12 new variables reused a freed id", flush=True)

# A watched tensor (a new one each step, of another shape for a last
# batch) keeps its tape's name.
x1, x2 = tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0, 5.0])
assert gradient_tape.default_name(None, [x1]) == gradient_tape.default_name(None, [x2])

# Keras fine-tuning with CSC: a layer frozen between fits (trainable=False,
# compile again with the same optimizer), then unfrozen. Keras passes the
# optimizer only the trainable variables, so the position of a gradient in
# that list names another variable once a layer is frozen; the optimizer's
# gradients are named by the variable's index in the optimizer instead (the
# CSC residual stays with its variable). Before 2026-11-29 the first frozen
# step added layer 0's unsent gradient to layer 1's (weights 0.05 off here;
# with layers of other sizes: "has 160 elements, but earlier calls under
# this name had 1024"). Reference: one allreduce per variable named by its
# index, the same CSC, SGD by hand.
def finetune_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(16),
                             keras.layers.Dense(16), keras.layers.Dense(16)])


PHASES = ((False, False), (True, False), (False, True))  # (layer 0 frozen, run_eagerly)
rng = np.random.default_rng(5)
XK = rng.standard_normal((len(PHASES), 2, N, 8, 16)).astype(np.float32)  # phase, step, rank
YK = rng.standard_normal((len(PHASES), 2, N, 8, 16)).astype(np.float32)
mse = keras.losses.MeanSquaredError()
model, ref = finetune_model(), finetune_model()
opt = gk.DistributedOptimizer(keras.optimizers.SGD(0.1), name="finetune", sparse_ratio=0.25)
every = list(ref.trainable_variables)
for p, (frozen, eager) in enumerate(PHASES):
    for m in (model, ref):
        m.layers[0].trainable = not frozen
    model.compile(optimizer=opt, loss=mse, run_eagerly=eager)
    model.fit(XK[p, :, R].reshape(-1, 16), YK[p, :, R].reshape(-1, 16), batch_size=8,
              shuffle=False, verbose=0)
    for s in range(2):
        with tf.GradientTape() as t:
            loss = mse(YK[p, s, R], ref(XK[p, s, R], training=True))
        for v, g in zip(ref.trainable_variables, t.gradient(loss, ref.trainable_variables)):
            i = next(k for k, e in enumerate(every) if e is v)
            v.assign_sub(0.1 * gtf.allreduce(g, name=f"finetune.ref.{i}", sparse_ratio=0.25))
for w, r in zip(model.get_weights(), ref.get_weights()):
    assert np.allclose(w, r, atol=1e-6), ("fine-tuning", np.abs(w - r).max())
    rows = gtf.allgather(tf.reshape(tf.constant(w), [1, -1])).numpy()
    assert all(np.array_equal(rows[0], rows[r]) for r in range(N)), "fine-tuning: ranks differ"
print(f"tf tape names OK rank {R}", flush=True)
