"""Native Note [Withdrawn names]: a collective that fails on one rank before it
reaches the core (a user Compressor raising, an input only that rank
refuses) fails on every rank at once with that rank's error, and the calls
after it pair with each other, never with the failed call's data.

Each case: the last rank fails call A of a name while the others submit
theirs; every rank checks the error it got (and how fast: well under
GRADFLOW_TIMEOUT, which the test sets high), then every rank calls the
same name (or the next unnamed one) again with step-2 data and checks the
result against numpy, bitwise alike on every rank. FRAMEWORK picks numpy,
torch or tensorflow (its ops eagerly and inside tf.function); CASES
(comma-separated) which cases run. Prints "OK <case>" each."""
import os
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
LAST = N - 1
FRAMEWORK = os.environ.get("FRAMEWORK", "numpy")
if FRAMEWORK == "torch":
    os.environ["KERAS_BACKEND"] = "torch"  # gradflow.keras's functions: the numpy path
    import torch

    import gradflow.keras as gk
    import gradflow.torch as gt
if FRAMEWORK == "numpy":
    from gradflow.elastic.state import broadcast_object as broadcast_state_object
if FRAMEWORK == "tensorflow":
    import tensorflow as tf

    import gradflow.tensorflow as gtf
    from gradflow.tensorflow.functions import broadcast_object


RAGGED = [[1.0, 2.0], [3.0]]  # no array or tensor can be made of it


def data(step, rank, n=6):
    return np.arange(n, dtype=np.float32) * (step + 1) + 10 * rank


def expected_sum(step, n=6):
    return sum(data(step, r, n) for r in range(N))


class Refuses:
    """A user Compressor (Horovod's interface) that raises on this rank."""

    @staticmethod
    def compress(tensor):
        raise RuntimeError(f"compressor broke on rank {R}")

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def allreduce_sum(x, name=None, failing=False):
    """One Sum allreduce of `x`; `failing`: this rank's call fails before
    it reaches the core (a user Compressor in torch, an object array in numpy,
    a string tensor in TensorFlow)."""
    if FRAMEWORK == "tensorflow":
        arr = tf.constant([b"x"] * len(x)) if failing else tf.constant(x)
        return gtf.allreduce(arr, op=gtf.Sum, name=name).numpy()
    if FRAMEWORK == "torch":
        comp = Refuses if failing else gt.Compression.none
        out = gt.allreduce(torch.from_numpy(x), name=name, op=gt.Sum, compression=comp)
        return out.numpy()
    arr = np.array([object()] * len(x)) if failing else x
    return gf.allreduce(arr, op=gf.Sum, name=name)


def expect_failure(call, mine, who=LAST, strict=False):
    """`call` must raise: on LAST its own error, elsewhere GradflowError
    naming LAST's error (as rank `who`: a set counts its members). `strict`:
    LAST's error must be its own, quoting `mine` (not one relayed). Returns
    seconds taken."""
    t0 = time.time()
    try:
        call()
    except Exception as e:  # noqa: BLE001 - checked below
        took = time.time() - t0
        text = str(e)
        if R == LAST and strict:
            assert mine in text and "before it was submitted" not in text, (R, type(e), text)
        elif R == LAST:
            assert mine in text or not isinstance(e, gf.GradflowError), (R, text)
        elif FRAMEWORK == "tensorflow" and isinstance(e, tf.errors.OpError):
            # Inside tf.function: TensorFlow's error for the GradflowError its node raised
            assert "GradflowError" in text, (R, type(e), text)
        else:
            assert isinstance(e, gf.GradflowError), (R, type(e), text)
            assert f"failed on rank {who}" in text and "before it was submitted" in text, text
        return took
    raise AssertionError(f"rank {R}: the call did not fail")


def check_same_everywhere(result, want):
    np.testing.assert_array_equal(result, want)
    everyone = gf.allgather(np.asarray(result, np.float32).reshape(1, -1), name="same.check")
    assert (everyone == everyone[0]).all(), everyone


def case_named():
    """Named call; the failing rank retries at once under the same name."""
    took = expect_failure(lambda: allreduce_sum(data(0, R), "w", failing=R == LAST), "broke")
    check_same_everywhere(allreduce_sum(data(1, R), "w"), expected_sum(1))
    return took


def case_unnamed():
    """Unnamed calls: the counters stay aligned after the failure."""
    took = expect_failure(lambda: allreduce_sum(data(0, R), failing=R == LAST), "broke")
    check_same_everywhere(allreduce_sum(data(1, R)), expected_sum(1))
    check_same_everywhere(allreduce_sum(data(2, R)), expected_sum(2))
    return took


def case_cached():
    """A name the response cache knows (its fast path) is withdrawn."""
    for step in range(3):
        check_same_everywhere(allreduce_sum(data(step, R), "cached"), expected_sum(step))
    took = expect_failure(lambda: allreduce_sum(data(5, R), "cached", failing=R == LAST), "broke")
    check_same_everywhere(allreduce_sum(data(6, R), "cached"), expected_sum(6))
    return took


def case_late_peers():
    """The failing rank retries before the others even reach the call: its
    retry waits for them to fail the first one, then pairs with their retry."""
    if R != LAST:
        time.sleep(1.0)
    took = expect_failure(lambda: allreduce_sum(data(0, R), "late", failing=R == LAST), "broke")
    check_same_everywhere(allreduce_sum(data(1, R), "late"), expected_sum(1))
    return took


def case_grouped():
    """A torch grouped allreduce whose Compressor fails on one rank: every
    member fails everywhere, the next grouped call is whole."""
    def call(step, failing):
        ts = [torch.from_numpy(data(step, R)), torch.from_numpy(data(step, R, 3) * 2)]
        comp = Refuses if failing else gt.Compression.none
        return [t.numpy() for t in gt.grouped_allreduce(ts, name="grp", op=gt.Sum,
                                                        compression=comp)]
    took = expect_failure(lambda: call(0, R == LAST), "broke")
    out = call(1, False)
    check_same_everywhere(out[0], expected_sum(1))
    check_same_everywhere(out[1], sum(data(1, r, 3) * 2 for r in range(N)))
    return took


def case_refused_by_core():
    """An input only this rank's core refuses (alltoall splits summing past
    the first dimension) is withdrawn too."""
    rows = np.arange(N * 2, dtype=np.float32).reshape(N * 2, 1) + 100 * R
    splits = [2] * N
    if R == LAST:
        splits[0] = 3
    took = expect_failure(lambda: gf.alltoall(rows, splits=splits, name="a2a"), "sum to")
    got, _ = gf.alltoall(rows, splits=[2] * N, name="a2a")
    want = np.concatenate([np.arange(N * 2, dtype=np.float32).reshape(N * 2, 1)[2 * R:2 * R + 2]
                           + 100 * r for r in range(N)])
    np.testing.assert_array_equal(got, want)
    return took


def case_process_set():
    """The same on a process set's engine (the last rank is a member): its
    members fail the call, the next one pairs; the other ranks take no part."""
    members = list(range(1, N))  # (at 2 ranks a one-member set: its one-rank path)
    ps = gf.add_process_set(members)
    took = 0.0
    if R in members:
        def call(step, failing):
            arr = np.array([object()] * 6) if failing else data(step, R)
            return gf.allreduce(arr, op=gf.Sum, name="in.set", process_set=ps)
        took = expect_failure(lambda: call(0, R == LAST), "object", members.index(LAST))
        np.testing.assert_array_equal(call(1, False), sum(data(1, r) for r in members))
    gf.remove_process_set(ps)
    return took


def case_bad_argument():
    """An argument bad on this rank alone (op, sparse_ratio, compression,
    broadcast root, reducescatter op; named and unnamed, and a torch grouped
    op): it used to be checked before the name was drawn, so the others
    waited for GRADFLOW_TIMEOUT and, unnamed, this rank's counter fell one
    behind: its call k paired with their call k+1 ever after, silently
    (Note [Checks after naming], gradflow/_withdrawal.py)."""
    bad = R == LAST
    x = data(0, R)
    if FRAMEWORK == "torch":
        t = torch.from_numpy(x)
        calls = [
            ("unknown reduce op", lambda nm: gt.allreduce(t, name=nm, op="bogus" if bad else gt.Sum)),
            ("unknown reduce op", lambda nm: gt.allreduce_async(
                t, name=nm, op=99 if bad else gt.Sum).wait()),
            ("unknown reduce op", lambda nm: gt.allreduce_(
                t.clone(), name=nm, op="bogus" if bad else gt.Sum)),
            ("sparse_ratio", lambda nm: gt.allreduce_async(
                t, name=nm, op=gt.Sum, sparse_ratio=0.0 if bad else None).wait()),
            ("compression", lambda nm: gt.allreduce(
                t, name=nm, op=gt.Sum, compression="fp16" if bad else gt.Compression.none)),
            ("supersedes average", lambda nm: gt.allreduce(
                t, name=nm, average=True if bad else None, op=gt.Sum)),
            ("invalid literal", lambda nm: gt.broadcast(t, "a" if bad else 0, name=nm)),
            ("whole rank", lambda nm: gt.broadcast_object({"r": R}, 0.5 if bad else 0, name=nm)),
            ("invalid literal", lambda nm: gt.broadcast_(t.clone(), "a" if bad else 0, name=nm)),
            ("unknown reduce op", lambda nm: gt.reducescatter_async(
                t, name=nm, op=99 if bad else gt.Sum).wait()),
            ("unknown reduce op", lambda nm: gt.grouped_allreduce_async(
                [t, t], name=nm, op="bogus" if bad else gt.Sum).wait()),
            # the differentiable forms, and their user Compressors
            ("unknown reduce op", lambda nm: gt.reducescatter(
                t, name=nm, op="bogus" if bad else gt.Sum)),
            ("unknown reduce op", lambda nm: gt.grouped_allreduce(
                [t, t], name=nm, op="bogus" if bad else gt.Sum)),
            ("supersedes average", lambda nm: gt.grouped_allreduce(
                [t, t], name=nm, average=True if bad else None, op=gt.Sum)),
            ("unknown reduce op", lambda nm: gt.grouped_reducescatter(
                [t, t], name=nm, op=99 if bad else gt.Sum)),
            ("broke", lambda nm: gt.reducescatter(
                t, name=nm, op=gt.Sum, compression=Refuses if bad else gt.Compression.none)),
            ("broke", lambda nm: gt.grouped_reducescatter(
                [t, t], name=nm, op=gt.Sum, compression=Refuses if bad else gt.Compression.none)),
            # Keras 3's functions on a backend other than TensorFlow
            ("unknown reduce op", lambda nm: gk.allreduce(
                x, name=nm, op="bogus" if bad else gf.Sum)),
            ("unknown reduce op", lambda nm: gk.reducescatter(
                x, name=nm, op=99 if bad else gf.Sum)),
            ("supersedes average", lambda nm: gk.allreduce(
                x, name=nm, average=True if bad else None, op=gf.Sum)),
            ("must be a bool", lambda nm: gk.allreduce(x, name=nm, average=gf.Sum if bad else False)),
            # a value only this rank cannot convert: converted once named too
            ("inhomogeneous", lambda nm: gk.allreduce(RAGGED if bad else x, name=nm, op=gf.Sum)),
            ("inhomogeneous", lambda nm: gk.allgather(RAGGED if bad else x, name=nm)),
            ("inhomogeneous", lambda nm: gk.broadcast(RAGGED if bad else x, 0, name=nm)),
            ("inhomogeneous", lambda nm: gk.reducescatter(RAGGED if bad else x, name=nm, op=gf.Sum)),
        ]
    elif FRAMEWORK == "tensorflow":
        return tf_bad_arguments(bad, x)
    else:
        calls = [
            ("unknown reduce op", lambda nm: gf.allreduce(x, name=nm, op="bogus" if bad else gf.Sum)),
            ("sparse_ratio", lambda nm: gf.allreduce(
                x, name=nm, op=gf.Sum, sparse_ratio=float("nan") if bad else None)),
            ("compression", lambda nm: gf.allreduce(
                x, name=nm, op=gf.Sum, compression="fp16" if bad else None)),
            ("invalid literal", lambda nm: gf.broadcast(x, "a" if bad else 0, name=nm)),
            # the elastic state's broadcast_object (numpy): collectives.broadcast_pickled
            ("whole rank", lambda nm: broadcast_state_object({"r": R}, 0.5 if bad else 0, nm)),
            ("unknown reduce op", lambda nm: gf.reducescatter(
                x, name=nm, op=99 if bad else gf.Sum)),
        ]
    took = 0.0
    for i, (mine, call) in enumerate(calls):
        for name in (f"bad.arg.{i}", None):
            took = max(took, expect_failure(lambda: call(name), mine, strict=True))
            check_same_everywhere(allreduce_sum(data(i + 1, R)), expected_sum(i + 1))
            check_same_everywhere(allreduce_sum(data(i + 2, R), f"after.bad.{i}"),
                                  expected_sum(i + 2))
    return took


def tf_bad_arguments(bad, x):
    """case_bad_argument's calls in TensorFlow, each eagerly and inside a
    tf.function after a healthy allreduce (which pairs: the graph fails at
    the bad op on every rank, at run time); then a new tf.function's unnamed
    allreduces pair too (no withdrawal left behind under their names)."""
    t, v = tf.constant(x), tf.Variable(x)
    text = tf.constant([b"x"] * len(x))
    rows = tf.constant(np.ones((2 * N, 1), np.float32))
    slices = tf.IndexedSlices(tf.constant(x.reshape(6, 1)), tf.range(6), tf.constant([6, 1]))
    calls = [
        ("unknown reduce op", lambda nm: gtf.allreduce(t, name=nm, op="bogus" if bad else gtf.Sum)),
        ("sparse_ratio", lambda nm: gtf.allreduce(
            t, name=nm, op=gtf.Sum, sparse_ratio=float("nan") if bad else None)),
        ("compression", lambda nm: gtf.allreduce(
            t, name=nm, op=gtf.Sum, compression="fp16" if bad else gtf.Compression.none)),
        ("supersedes average", lambda nm: gtf.allreduce(
            t, name=nm, average=True if bad else None, op=gtf.Sum)),
        ("supports Sum and Average", lambda nm: gtf.allreduce(
            slices, name=nm, op=gtf.Min if bad else gtf.Sum).values),
        ("unknown reduce op", lambda nm: gtf.grouped_allreduce(
            [t, t], name=nm, op=99 if bad else gtf.Sum)),
        ("invalid literal", lambda nm: gtf.broadcast(t, "a" if bad else 0, name=nm)),
        ("whole rank", lambda nm: gtf.broadcast_(v, 0.5 if bad else 0, name=nm)),
        ("unknown reduce op", lambda nm: gtf.reducescatter(
            t, name=nm, op="bogus" if bad else gtf.Sum)),
        ("unknown reduce op", lambda nm: gtf.grouped_reducescatter(  # (no name= in Horovod's)
            [t, t], op="bogus" if bad else gtf.Sum)),
        ("unsupported dtype", lambda nm: gtf.allgather(text if bad else t, name=nm)),
        ("unsupported dtype", lambda nm: gtf.grouped_allgather([t, text if bad else t], name=nm)),
        ("splits must be integers", lambda nm: gtf.alltoall(
            rows, splits=[2.0 if bad else 2] * N, name=nm)),
    ]
    # TensorFlow's first tf.function call takes seconds on a loaded machine: not timed
    tf.function(lambda: gtf.allreduce(t, op=gtf.Sum))()
    took = 0.0
    for i, (mine, call) in enumerate(calls):
        for graph in (False, True):
            for name in (f"bad.tf.{i}.{graph}", None):
                if graph:
                    def run(nm=name, call=call):
                        return tf.function(lambda: (gtf.allreduce(t, op=gtf.Sum), call(nm)))()
                else:
                    def run(nm=name, call=call):
                        return call(nm)
                took = max(took, expect_failure(run, mine, strict=True))
                check_same_everywhere(allreduce_sum(data(i + 1, R)), expected_sum(i + 1))
                check_same_everywhere(allreduce_sum(data(i + 2, R), f"after.bad.{i}"),
                                      expected_sum(i + 2))
                if graph:
                    two = tf.function(lambda s: [gtf.allreduce(tf.constant(data(s, R)), op=gtf.Sum)
                                                 for _ in range(2)])(i + 3)
                    for y in two:
                        check_same_everywhere(y.numpy(), expected_sum(i + 3))
    # A value only this rank cannot convert to a tensor, eagerly: converted
    # once named (arguments.converted). (Inside tf.function it fails this
    # rank's trace: the README says the others then wait.)
    eager_only = [
        lambda nm: gtf.allreduce(RAGGED if bad else x, name=nm, op=gtf.Sum),
        lambda nm: gtf.allgather(RAGGED if bad else x, name=nm),
        lambda nm: gtf.broadcast(RAGGED if bad else x, 0, name=nm),
        lambda nm: gtf.reducescatter(RAGGED if bad else x, name=nm, op=gtf.Sum),
        lambda nm: gtf.grouped_allreduce([x, RAGGED if bad else x], name=nm, op=gtf.Sum),
        lambda nm: gtf.grouped_allgather([x, RAGGED if bad else x], name=nm),
        lambda nm: gtf.grouped_reducescatter([x, RAGGED if bad else x], op=gtf.Sum),
    ]
    for i, call in enumerate(eager_only):
        for name in (f"ragged.tf.{i}", None):
            took = max(took, expect_failure(lambda: call(name), "non-rectangular", strict=True))
            check_same_everywhere(allreduce_sum(data(i + 1, R)), expected_sum(i + 1))
    # broadcast_object runs in Python in any mode: its root is checked once named
    for name in ("bad.object", None):
        took = max(took, expect_failure(
            lambda: broadcast_object({"r": R}, root_rank=0.5 if bad else 0, name=name),
            "whole rank", strict=True))
        assert broadcast_object({"r": R}, root_rank=0, name=name) == {"r": 0}
        check_same_everywhere(allreduce_sum(data(1, R)), expected_sum(1))
    return took


def case_duplicate():
    """The same name submitted twice without waiting: rank 0's first call
    has completed, so its second is accepted; on the others the first is
    still in flight and the second is refused ("submitted twice"). Rank 0's
    second call used to pair with their next call under the name, silently
    (native Note [Withdrawing a name in flight], tensor_queue.cc)."""
    if N == 1:
        return 0.0
    took = 0.0
    if R == 0:
        time.sleep(0.5)  # the others' first call is in flight when they call again
        first = gf.allreduce_async(data(0, R), op=gf.Sum, name="dup")
        np.testing.assert_array_equal(first.wait(), expected_sum(0))
        t0 = time.time()
        second = gf.allreduce_async(data(1, R), op=gf.Sum, name="dup")
        try:
            second.wait()
        except gf.GradflowError as e:
            assert "failed on rank 1" in str(e) and "submitted twice" in str(e), str(e)
        else:
            raise AssertionError("rank 0's second call under 'dup' did not fail")
        took = time.time() - t0
    else:
        first = gf.allreduce_async(data(0, R), op=gf.Sum, name="dup")
        try:
            gf.allreduce_async(data(1, R), op=gf.Sum, name="dup")
        except ValueError as e:
            assert "submitted twice" in str(e), str(e)
        else:
            raise AssertionError(f"rank {R}: the second call under 'dup' was accepted")
        np.testing.assert_array_equal(first.wait(), expected_sum(0))
    check_same_everywhere(allreduce_sum(data(2, R), "dup"), expected_sum(2))
    check_same_everywhere(allreduce_sum(data(3, R)), expected_sum(3))
    return took


CASES = {"named": case_named, "unnamed": case_unnamed, "cached": case_cached,
         "late": case_late_peers, "grouped": case_grouped, "refused": case_refused_by_core,
         "set": case_process_set, "bad_argument": case_bad_argument,
         "duplicate": case_duplicate}
default = [c for c in CASES if FRAMEWORK == "torch" or c != "grouped"]
if FRAMEWORK == "tensorflow":  # (the other cases are numpy's alone)
    default = ["named", "unnamed", "cached", "late", "bad_argument"]
for case in os.environ.get("CASES", ",".join(default)).split(","):
    took = CASES[case]()
    # GRADFLOW_TIMEOUT is 60 s: the other ranks learn within a few cycles.
    assert took < 10, (case, took)
    print(f"rank {R}: OK {case} ({took:.2f} s)", flush=True)
gf.shutdown()
sys.exit(0)
