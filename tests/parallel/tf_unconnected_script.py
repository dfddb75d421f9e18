# tests/parallel/tf_unconnected_script.py — SPMD script (test_tensorflow.py):
# a variable the loss uses on some ranks only (Python control flow), through
# DistributedGradientTape. Its gradient is None there and None gradients are
# not reduced (as in Horovod), so by default the call stalls and ends in
# gradflow's stall error, which now says what to do; with
# unconnected_gradients=ZERO every rank reduces it and the result equals the
# numpy average. Run with a short GRADFLOW_TIMEOUT. Exits non-zero on failure.
from _tf_common import tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.tensorflow as gtf  # noqa: E402

gtf.init()
R, N = gtf.rank(), gtf.size()
a = tf.Variable(np.arange(4, dtype=np.float32))
b = tf.Variable(np.ones(4, np.float32))


def uses_b(rank: int, step: int) -> bool:
    return (rank + step) % 2 == 0


def gradients(step: int, **kw):
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(a * a) * (R + 1)
        if uses_b(R, step):
            loss += tf.reduce_sum(b * 3.0) * (R + 1)
    return gtf.DistributedGradientTape(t).gradient(loss, [a, b], **kw)


# 1. unconnected_gradients=ZERO: b's gradient is zeros where unused, and the
# average equals numpy's over every rank's closed-form gradient.
for step in range(3):
    ga, gb = gradients(step, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    ref_a = np.mean([2 * np.arange(4) * (r + 1) for r in range(N)], axis=0)
    ref_b = np.mean([np.full(4, 3.0 * (r + 1)) if uses_b(r, step) else np.zeros(4)
                     for r in range(N)], axis=0)
    assert np.allclose(ga.numpy(), ref_a), (step, ga.numpy(), ref_a)
    assert np.allclose(gb.numpy(), ref_b), (step, gb.numpy(), ref_b)
every = gtf.allgather_object(gb.numpy().tobytes())
assert all(e == every[0] for e in every), "reduced gradients differ between ranks"
print(f"unconnected ZERO OK rank {R}", flush=True)

# 2. default (None): ranks without b's gradient finish the call, the others
# stall on it; the stall error (GRADFLOW_TIMEOUT) reaches every rank, at the
# latest at its next collective, and the tape's message names the fix.
try:
    gradients(0)
    gtf.allreduce(np.ones(2, np.float32), name="after")
except gtf.GradflowError as e:
    msg = str(e)
    assert "stall" in msg or "abort" in msg or "fail" in msg, msg
    if uses_b(R, 0):
        assert "unconnected_gradients=tf.UnconnectedGradients.ZERO" in msg, msg
    print(f"unconnected None error OK rank {R}: {msg[:160]}", flush=True)
else:
    raise AssertionError("a gradient None on some ranks only did not fail")
