# tests/parallel/tf_overlap_script.py — SPMD script (run by test_tf_overlap.py under
# mpiexec): gradient reduction overlapped with backward inside tf.function
# (gradflow/tensorflow/overlap.py). Checks the graph's structure (each submit
# depends on its own gradient only, submits precede waits), and the numbers:
# reduced gradients against a numpy reference, bitwise identical on every rank,
# dense fp32 and fp16 wire, with a None gradient and an IndexedSlices gradient;
# a compiled Keras train step against numpy SGD. Exits non-zero on failure.
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")
import gradflow  # noqa: E402
import gradflow.tensorflow as hvd  # noqa: E402
from gradflow.tensorflow import overlap  # noqa: E402

from _exact_checks import same_everywhere  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
DIMS = [12, 16, 9, 5]          # dense layers 12->16->9->5
VOCAB, EMB = 7, 12             # embedding rows feed the first dense layer


def make_vars():
    rng = np.random.default_rng(7)  # the same initial values on every rank
    vs = {"emb": tf.Variable(rng.standard_normal((VOCAB, EMB)).astype(np.float32), name="emb")}
    for k, (a, b) in enumerate(zip(DIMS[:-1], DIMS[1:])):
        vs[f"w{k}"] = tf.Variable((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
        vs[f"b{k}"] = tf.Variable((rng.standard_normal(b) * 0.1).astype(np.float32))
    vs["unused"] = tf.Variable(np.ones(3, np.float32))  # its gradient is None
    return vs


def batch(r):
    rng = np.random.default_rng(100 + r)
    ids = rng.integers(0, VOCAB, size=6).astype(np.int32)
    y = rng.standard_normal((6, DIMS[-1])).astype(np.float32)
    return ids, y


def loss_fn(vs, ids, y):
    h = tf.gather(vs["emb"], ids)  # gradient: tf.IndexedSlices
    for k in range(len(DIMS) - 1):
        h = tf.matmul(h, vs[f"w{k}"]) + vs[f"b{k}"]
        if k < len(DIMS) - 2:
            h = tf.nn.relu(h)
    return tf.reduce_mean(tf.square(h - y))


def local_grads(vs, r):
    """Rank r's own gradients (plain tape, eager), IndexedSlices made dense."""
    ids, y = batch(r)
    vlist = list(vs.values())
    with tf.GradientTape() as tape:
        loss = loss_fn(vs, ids, y)
    grads = tape.gradient(loss, vlist)
    return [None if g is None else np.asarray(tf.convert_to_tensor(g)) for g in grads]


def check_graph_structure(vs):
    """Submit i depends on gradient i only: no submit needs the first dense
    layer's kernel gradient except that kernel's own submit."""
    ids, y = batch(R)
    vlist = list(vs.values())

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, ids, y)
        return hvd.DistributedGradientTape(tape, name="struct").gradient(loss, vlist)

    g = step.get_concrete_function().graph
    submits = [op for op in g.get_operations() if op.name.startswith("gradflow_submit")]
    waits = [op for op in g.get_operations() if op.name.startswith("gradflow_wait")]
    dense = len(DIMS) - 1
    assert len(submits) == 2 * dense and len(waits) == 2 * dense, (len(submits), len(waits))

    def ancestors(op):
        seen, todo = set(), [op]
        while todo:
            o = todo.pop()
            for t in list(o.inputs) + list(o.control_inputs):
                src = t.op if hasattr(t, "op") else t
                if src.name not in seen:
                    seen.add(src.name)
                    todo.append(src)
        return seen

    # The first submit created is the last variable's; it must not wait for
    # the first dense layer's kernel gradient (computed last in backward).
    first = ancestors(submits[0])
    assert not any(n.startswith("gradflow_wait") for n in first)
    w0_grad = [s.inputs[0].op.name for s in submits
               if s.inputs[0].shape.as_list() == [DIMS[0], DIMS[1]]]
    assert len(w0_grad) == 1, w0_grad
    assert w0_grad[0] not in first, f"the first submit waits for {w0_grad[0]}"
    assert w0_grad[0] in ancestors(submits[-1])  # the test would notice a wrong pick
    for w in waits:  # every wait comes after every submit (control chain)
        anc = ancestors(w)
        assert all(s.name in anc for s in submits), w.name


def reference(vs, compression):
    per_rank = [local_grads(vs, r) for r in range(N)]
    out = []
    for i in range(len(per_rank[0])):
        if per_rank[0][i] is None:
            out.append(None)
            continue
        xs = [p[i] for p in per_rank]
        if compression == "fp16" and i != 0:  # the embedding (i 0) is allgathered: no wire codec
            xs = [x.astype(np.float16).astype(np.float32) for x in xs]
        out.append(np.sum(xs, axis=0, dtype=np.float32) / np.float32(N))
    return out


def check_tape_numbers(compression, tag):
    vs = make_vars()
    ids, y = batch(R)
    vlist = list(vs.values())
    comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, ids, y)
        return hvd.DistributedGradientTape(tape, compression=comp,
                                           name=f"tape.{tag}").gradient(loss, vlist)

    want = reference(vs, compression)
    for rep in range(2):  # the second run takes the core's cached path
        got = step()
        assert overlap.pending_count() == 0
        assert isinstance(got[0], tf.IndexedSlices), type(got[0])
        assert got[-1] is None
        for i, (g, w) in enumerate(zip(got, want)):
            if w is None:
                continue
            a = np.asarray(tf.convert_to_tensor(g))
            tol = 2e-3 if compression == "fp16" else 1e-6
            assert a.shape == w.shape and a.dtype == np.float32, (i, a.shape, a.dtype)
            err = np.max(np.abs(a - w)) / (np.max(np.abs(w)) + 1e-12)
            assert err <= tol, f"rank {R}: {tag} grad {i} rep {rep}: rel err {err}"
            same_everywhere(a, f"{tag}.{i}.{rep}")


def check_keras_step(compression, tag):
    """A compiled Keras train step (train_on_batch) with hvd DistributedOptimizer:
    one SGD step equals w - lr * (reference averaged gradient)."""
    import keras
    keras.utils.set_random_seed(3)  # the same initial weights on every rank
    model = keras.Sequential([keras.Input((DIMS[0],)), keras.layers.Dense(DIMS[1], activation="relu"),
                              keras.layers.Dense(DIMS[2], activation="relu"),
                              keras.layers.Dense(DIMS[3])])
    comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
    lr = 0.1
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), compression=comp,
                                   name=f"keras.{tag}")
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    rng = np.random.default_rng(50 + R)
    x = rng.standard_normal((4, DIMS[0])).astype(np.float32)
    y = rng.standard_normal((4, DIMS[-1])).astype(np.float32)
    w_before = [np.asarray(w) for w in model.get_weights()]
    submits_before = overlap.overlapped_submits()
    xs = gradflow.allgather(x, name=f"x.{tag}").reshape(N, 4, DIMS[0])
    ys = gradflow.allgather(y, name=f"y.{tag}").reshape(N, 4, DIMS[-1])
    grads = []
    for r in range(N):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xs[r]) - ys[r]))
        grads.append([np.asarray(g) for g in tape.gradient(loss, model.trainable_variables)])
    model.train_on_batch(x, y)
    assert overlap.pending_count() == 0
    for i, w in enumerate(model.get_weights()):
        gs = [g[i] for g in grads]
        if compression == "fp16":
            gs = [g.astype(np.float16).astype(np.float32) for g in gs]
        want = w_before[i] - np.float32(lr) * (np.sum(gs, axis=0, dtype=np.float32) / np.float32(N))
        err = np.max(np.abs(w - want))
        tol = 2e-3 if compression == "fp16" else 1e-5
        assert err <= tol * (np.max(np.abs(want)) + 1.0), f"rank {R}: {tag} weight {i}: err {err}"
        same_everywhere(w, f"{tag}.w{i}")
    assert overlap.overlapped_submits() - submits_before == 2 * (len(DIMS) - 1), \
        "keras step: gradients did not take the overlapped path"


def check_switch_off():
    """GRADFLOW_TF_OVERLAP=0: one crossing (no submit nodes), same numbers;
    a bad value raises a ValueError at trace time."""
    vs = make_vars()
    ids, y = batch(R)
    vlist = list(vs.values())
    os.environ[overlap.OVERLAP_ENV] = "0"

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(vs, ids, y)
        return hvd.DistributedGradientTape(tape, name="off").gradient(loss, vlist)

    g = step.get_concrete_function().graph
    assert not any(op.name.startswith("gradflow_submit") for op in g.get_operations())
    got = step()
    want = reference(vs, "none")
    for i, w in enumerate(want):
        if w is not None:
            a = np.asarray(tf.convert_to_tensor(got[i]))
            assert np.max(np.abs(a - w)) <= 1e-6 * (np.max(np.abs(w)) + 1e-12)
            same_everywhere(a, f"off.{i}")
    os.environ[overlap.OVERLAP_ENV] = "maybe"
    try:
        overlap.overlap_enabled()
        raise AssertionError("GRADFLOW_TF_OVERLAP=maybe accepted")
    except ValueError as e:
        assert "GRADFLOW_TF_OVERLAP" in str(e)
    os.environ[overlap.OVERLAP_ENV] = "1"


check_graph_structure(make_vars())
check_tape_numbers("none", "fp32")
check_tape_numbers("fp16", "fp16")
check_keras_step("none", "kfp32")
check_keras_step("fp16", "kfp16")
check_switch_off()
hvd.shutdown()
print("tf overlap OK", flush=True)
