# grouped_lists_script.py — SPMD (test_errors.py): a grouped op whose list
# differs in length between ranks (native Note [Grouped lists]). Before, the
# common tensors were reduced as if nothing were wrong and the longer lists'
# extra ones waited for GRADFLOW_TIMEOUT (60 s). Now, with default settings,
# every rank raises within seconds with a message naming both lengths, and
# the job is over (the runtime refuses the next collective), as for differing
# step tags. Each rank prints one line, then leaves through gradflow's fatal
# exit (non-zero).
#   argv[1]: torch | tf
#   argv[2]: allreduce | allreduce_async | allgather | reducescatter |
#            traced (tf.function) | broadcast_ (tf variables)
#   argv[3]: last-longer | first-longer | one-vs-four | list-vs-single |
#            empty-on-one (rank 1 passes an empty list: it submits nothing,
#            so before, the others waited GRADFLOW_TIMEOUT; now a marker
#            aborts the job and rank 1 raises at its next collective)
# Before the bad call, every rank passes an empty list twice (nothing
# happens, the names stay in step), then two good grouped calls under the
# same names check the values against numpy (so the bad call also meets
# cached names, and the good ones queue behind the empty lists' markers).
import sys
import time

import numpy as np

import gradflow as gf

FRAMEWORK, OP, LAYOUT = sys.argv[1:4]
if FRAMEWORK == "tf":
    import tensorflow as tf

    import gradflow.tensorflow as hvd
else:
    import torch

    import gradflow.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
LENGTHS = {"last-longer": [2 + (r == N - 1) for r in range(N)],
           "first-longer": [3 if r == 0 else 2 for r in range(N)],
           "one-vs-four": [1 if r == 1 else 4 for r in range(N)],
           "list-vs-single": [None if r == N - 1 else 2 for r in range(N)],
           "empty-on-one": [0 if r == 1 else 2 for r in range(N)]}[LAYOUT]


def arrays(k: int, rows: int):
    """k float32 arrays whose values differ per rank and per member."""
    return [np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * (i + 1) + R
            for i in range(k)]


def wrap(xs):
    return [tf.constant(x) for x in xs] if FRAMEWORK == "tf" else [torch.from_numpy(x) for x in xs]


def run(k: int):
    """The grouped op on k tensors (None: the single-tensor op on one)."""
    rows = {"allgather": R + 1, "reducescatter": N}.get(OP, 2)
    xs = wrap(arrays(1 if k is None else k, rows))
    if k is None:  # list-vs-single: a plain allreduce under the first member's name
        assert OP == "allreduce", "list-vs-single is an allreduce layout"
        return [hvd.allreduce(xs[0], op=hvd.Sum, name="grp.0")]
    if OP in ("allreduce", "traced"):
        if OP == "traced":
            return tf.function(lambda *v: hvd.grouped_allreduce(list(v), op=hvd.Sum,
                                                                name="grp"))(*xs)
        return hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")
    if OP == "allreduce_async":
        return hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum, name="grp"))
    if OP == "allgather":
        return hvd.grouped_allgather(xs, name="grp")
    if OP == "reducescatter":
        return hvd.grouped_reducescatter(xs, op=hvd.Sum, name="grp") if FRAMEWORK == "torch" \
            else hvd.grouped_reducescatter(xs, op=hvd.Sum)
    if OP == "broadcast_":
        return hvd.broadcast_([tf.Variable(x) for x in xs], 0, name="grp")
    raise SystemExit(f"unknown op {OP}")


def expected(k: int):
    rows = {"allgather": R + 1, "reducescatter": N}.get(OP, 2)
    per_rank = [[np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * (i + 1) + r
                 for i in range(k)] for r in range(N)]
    if OP == "allgather":
        return [np.concatenate([np.arange((r + 1) * 3, dtype=np.float32).reshape(r + 1, 3)
                                * (i + 1) + r for r in range(N)]) for i in range(k)]
    if OP == "broadcast_":
        return per_rank[0]
    total = [sum(per_rank[r][i] for r in range(N)) for i in range(k)]
    return [t[R:R + 1] for t in total] if OP == "reducescatter" else total


for _ in range(2):
    assert list(run(0)) == [], "an empty list on every rank returns []"
if OP != "reducescatter" or FRAMEWORK == "torch":  # TF's grouped_reducescatter takes no name
    for _ in range(2):
        for got, want in zip(run(2), expected(2)):
            np.testing.assert_array_equal(np.asarray(got), want)

t0 = time.monotonic()
try:
    run(LENGTHS[R])
    if LENGTHS[R] == 0:  # nothing submitted: the abort reaches this rank's next call
        gf.allreduce(np.ones(2, np.float32), name="after")
except Exception as e:  # GradflowError; a tf error inside a tf.function
    msg = str(e)
else:
    raise AssertionError(f"rank {R}: no error with a list of {LENGTHS[R]}")
took = time.monotonic() - t0
assert "every rank must pass a list of the same length" in msg, msg
for n in set(LENGTHS):
    want = {None: "a single tensor (no list)", 0: "an empty list"}.get(n, f"a list of {n} tensors")
    assert want in msg, (want, msg)
assert took < 15, f"rank {R}: the error came after {took:.1f} s"
try:
    gf.allreduce(np.ones(2, np.float32), name="after")
except gf.GradflowError as e:
    assert "every rank must pass a list of the same length" in str(e), str(e)
else:
    raise AssertionError("the runtime went on after the lists differed")
print(f"grouped lists OK rank {R} of {N} ({took:.2f} s)", flush=True)
