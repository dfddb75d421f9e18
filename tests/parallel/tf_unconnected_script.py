# tests/parallel/tf_unconnected_script.py — SPMD script (test_tensorflow.py):
# a variable the loss uses on some ranks only (Python control flow), through
# DistributedGradientTape (Note [None on some ranks] in
# gradflow/missing_gradients.py). Eagerly its gradient is reduced with
# zeros from the ranks without one and equals numpy's average; a variable no
# rank uses keeps a None gradient; unconnected_gradients=ZERO gives the same
# numbers. In a tf.function traced differently per rank the stall ends in an
# error on every rank (short GRADFLOW_TIMEOUT). Exits non-zero on failure.
from _tf_common import tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
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


for kw in ({}, {"unconnected_gradients": tf.UnconnectedGradients.ZERO}):
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


# a tf.function traced differently on each rank: which gradients are None is
# fixed in each trace, so the ranks with b's gradient stall on it; the stall
# error (GRADFLOW_TIMEOUT) reaches every rank, at the latest at its next call.
@tf.function
def traced():
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(a * a)
        if uses_b(R, 0):
            loss += tf.reduce_sum(b * 3.0)
    return gtf.DistributedGradientTape(t).gradient(loss, [a, b])


try:
    traced()
    gtf.allreduce(np.ones(2, np.float32), name="after")
except (gtf.GradflowError, tf.errors.OpError) as e:
    assert "stall" in str(e), str(e)[-300:]
    print(f"traced None on some ranks: error OK rank {R}", flush=True)
else:
    raise AssertionError("differently traced gradients did not fail")
