# tests/parallel/tf_unconnected_script.py — SPMD script (test_tensorflow.py):
# a variable the loss uses on some ranks only (Python control flow), through
# DistributedGradientTape (Note [None on some ranks] in
# gradflow/missing_gradients.py). Eagerly its gradient is reduced with
# zeros from the ranks without one and equals numpy's average; a variable no
# rank uses keeps a None gradient; unconnected_gradients=ZERO gives the same
# numbers. A step traced differently per rank (a tf.function around the tape,
# argv[1] == "tape"; Keras fit on the TensorFlow backend, "keras") aborts the
# job on every rank within seconds, default timeouts, with the step tags of
# both ranks (native Note [Step tags]; before: a stall until GRADFLOW_TIMEOUT);
# it then prints a line and the process exits non-zero (the runtime is dead).
# "trace": a tf.function whose trace raises on rank 1 only (trace_fails_on_one_rank).
import sys
import time

from _tf_common import keras, tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.tensorflow as gtf  # noqa: E402

gtf.init()
R, N = gtf.rank(), gtf.size()
a = tf.Variable(np.arange(4, dtype=np.float32))
b = tf.Variable(np.ones(4, np.float32))
never = tf.Variable(np.ones(2, np.float32))


def uses_b(rank: int, step: int) -> bool:
    return (rank + step) % 2 == 0


def gradients(step: int, **kw):
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(a * a) * (R + 1)
        if uses_b(R, step):
            loss += tf.reduce_sum(b * 3.0) * (R + 1)
    return gtf.DistributedGradientTape(t).gradient(loss, [a, b, never], **kw)


CASE = sys.argv[1]
for kw in ({}, {"unconnected_gradients": tf.UnconnectedGradients.ZERO}) if CASE == "tape" else ():
    for step in range(3):
        ga, gb, gn = gradients(step, **kw)
        ref_a = np.mean([2 * np.arange(4) * (r + 1) for r in range(N)], axis=0)
        ref_b = np.mean([np.full(4, 3.0 * (r + 1)) if uses_b(r, step) else np.zeros(4)
                         for r in range(N)], axis=0)
        assert np.allclose(ga.numpy(), ref_a), (step, ga.numpy(), ref_a)
        assert np.allclose(gb.numpy(), ref_b), (kw, step, gb.numpy(), ref_b)
        if kw:
            assert np.array_equal(gn.numpy(), np.zeros(2)), gn
        else:
            assert gn is None, f"a gradient None on every rank became {gn}"
    every = gtf.allgather_object(gb.numpy().tobytes())
    assert all(e == every[0] for e in every), "reduced gradients differ between ranks"
    print(f"eager None on some ranks OK ({'ZERO' if kw else 'default'}) rank {R}", flush=True)


# A step traced differently on each rank: which gradients are None is fixed
# in each trace, so the ranks submit different names. Every rank must fail at
# once with both ranks' step tags, not after GRADFLOW_TIMEOUT (60 s here).
@tf.function
def traced():
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(a * a)
        if uses_b(R, 0):
            loss += tf.reduce_sum(b * 3.0)
    return gtf.DistributedGradientTape(t).gradient(loss, [a, b])


class Branchy(keras.Model):
    """A layer used on some ranks only, decided when Keras traces train_step."""

    def __init__(self):
        super().__init__()
        self.a, self.b = keras.layers.Dense(3), keras.layers.Dense(3)

    def call(self, x, training=False):
        y = self.a(x)
        return y + self.b(x) if training and uses_b(R, 0) else y


def keras_fit():
    import gradflow.keras as hvd  # noqa: PLC0415
    model = Branchy()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x = np.ones((8, 4), np.float32)
    model.fit(x, np.zeros((8, 3), np.float32), batch_size=4, epochs=1, verbose=0)


def trace_fails_on_one_rank():
    """Rank 1's trace of a tf.function raises (Python code at trace time);
    the other ranks traced theirs and wait in its first collective, which
    rank 1 never submits (Note [A trace that fails on one rank],
    docs/tensorflow.md). Caught there, with the program going on to another
    collective: the ranks wait on different names, so every rank fails at
    GRADFLOW_TIMEOUT (4 s here) with the stall message naming both, and the
    runtime stays usable. Uncaught: gradflow's excepthook aborts the job, and
    the others' run fails quoting rank 1's exception within seconds (the
    message tells the two apart: a timeout would give the stall message)."""
    def step(x):
        y = gtf.allreduce(x, op=gtf.Sum)
        if R == 1:
            raise RuntimeError(f"boom while tracing on rank {R}")
        return gtf.allreduce(y, op=gtf.Sum)

    x = tf.ones([3])
    try:
        tf.function(step)(x)
        raise AssertionError("the run did not fail")
    except RuntimeError as e:  # rank 1: its own trace error, caught
        assert R == 1 and "boom while tracing" in str(e), e
        try:
            gtf.allreduce(np.ones(2, np.float32), name="after a failed trace")
            raise AssertionError("'after a failed trace' completed")
        except gtf.GradflowError as stall:
            text = str(stall)
    except tf.errors.OpError as e:  # the others: their run of the graph
        assert R != 1, e
        text = str(e)
    assert "GRADFLOW_TIMEOUT" in text and "missing on ranks" in text, text[-600:]
    print(f"trace failed on one rank, caught: stall error OK rank {R}", flush=True)
    # The runtime is usable: every pending name failed on every rank.
    total = gtf.allreduce(np.full(2, R + 1.0, np.float32), op=gtf.Sum, name="usable")
    assert np.allclose(total.numpy(), N * (N + 1) / 2), total
    if R == 1:
        print(f"trace failed on one rank, uncaught: raising rank {R}", flush=True)
        tf.function(step)(x)  # never returns: the exception ends this rank
        raise AssertionError("the trace did not fail")
    try:
        tf.function(step)(x)
        raise AssertionError("the run did not fail")
    except (gtf.GradflowError, tf.errors.OpError) as e:
        text = str(e)
    assert "rank 1 failed" in text and "boom while tracing on rank 1" in text, text[-600:]
    print(f"trace failed on one rank, uncaught: abort OK rank {R}", flush=True)


if CASE == "trace":
    trace_fails_on_one_rank()
    sys.exit(1)  # as a program whose run failed (the runtime is aborted)

t0 = time.monotonic()
try:
    traced() if CASE == "tape" else keras_fit()
    gtf.allreduce(np.ones(2, np.float32), name="after")
except (gtf.GradflowError, tf.errors.OpError) as e:
    took = time.monotonic() - t0
    text = str(e)
    assert "reduce different sets of gradients in one step" in text, text[-600:]
    assert " of 2 gradients #" in text, text[-600:]
    assert took < 30, f"the error came after {took:.0f} s"
    print(f"traced None on some ranks, {CASE}: error OK rank {R}", flush=True)
else:
    raise AssertionError("differently traced gradients did not fail")
