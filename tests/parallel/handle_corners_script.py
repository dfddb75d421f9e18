# handle_corners_script.py — SPMD (test_errors.py), default settings, 3 ranks
# (2 for sections 1-3). Handles where they meet other features:
#  1. a grouped op whose member fails on this rank before submission (an
#     unsupported dtype, a user Compressor raising) submits none of its
#     members: no earlier member stays in flight, the input is left alone,
#     and a retry under the same name is correct (numpy);
#  2. poll() from one thread while another waits on the same handle never
#     raises;
#  3. Ctrl-C (SIGINT) in the main thread ends a wait within a second; the
#     collective goes on and a second wait() returns its result;
#  4. (3 ranks) remove_process_set: a completed handle of the removed set
#     still returns its result; a pending one fails saying the set was
#     removed (it used to say shutdown() was called).
import os
import signal
import sys
import threading
import time

import numpy as np
import torch

import gradflow as gf
import gradflow.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()


def ok(what: str) -> None:
    print(f"ok {what} rank {R}", flush=True)


def rank_values(k: int = 0) -> np.ndarray:
    return np.arange(4, dtype=np.float32) * (R + 1) + k


def rank_sum(k: int = 0) -> np.ndarray:
    return sum(np.arange(4, dtype=np.float32) * (r + 1) + k for r in range(N))


# ---- 1. grouped op, local failure before submission, every rank alike
class FailingCompressor:
    """Compresses by identity, but raises for tensors marked with a 7."""

    @staticmethod
    def compress(tensor):
        if tensor.numel() and float(tensor.reshape(-1)[0]) == 7.0:
            raise RuntimeError("compress refused")
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


for case in ("dtype", "compressor"):
    first = torch.from_numpy(rank_values())
    before = first.clone()
    if case == "dtype":
        bad = [first, torch.zeros(4, dtype=torch.complex64), torch.ones(4)]
        fail = lambda: hvd.grouped_allreduce_(bad, op=hvd.Sum, name=f"grp.{case}")  # noqa: E731
    else:
        bad = [first, torch.full((4,), 7.0), torch.ones(4)]
        fail = lambda: hvd.grouped_allreduce_(bad, op=hvd.Sum, name=f"grp.{case}",  # noqa: E731
                                              compression=FailingCompressor)
    try:
        fail()
    except (TypeError, RuntimeError, ValueError):
        pass
    else:
        raise AssertionError(f"{case}: no error")
    time.sleep(0.3)  # a member left in flight would run meanwhile
    assert torch.equal(first, before), (case, first, before)
    good = [torch.from_numpy(rank_values(k)) for k in range(3)]
    hvd.grouped_allreduce_(good, op=hvd.Sum, name=f"grp.{case}")
    for k, t in enumerate(good):
        np.testing.assert_array_equal(t.numpy(), rank_sum(k))
    ok(f"grouped {case} failure submits nothing")

# ---- 2. poll() while another thread waits
for trial in range(20):
    if R == 1:
        time.sleep(0.02)
    h = gf.collectives.allreduce_async(rank_values(trial), gf.Sum, f"race.{trial}")
    results = []
    waiter = threading.Thread(target=lambda: results.append(h.wait()))
    waiter.start()
    while waiter.is_alive():
        h.poll()  # must not raise "unknown or already waited handle"
    waiter.join()
    assert h.poll()
    np.testing.assert_array_equal(results[0], rank_sum(trial))
ok("poll while another thread waits")

# ---- 3. Ctrl-C during wait
if R == 1:
    time.sleep(2.5)  # rank 0 is interrupted meanwhile
h = gf.collectives.allreduce_async(rank_values(5), gf.Sum, "interrupted")
if R == 0:
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        h.wait()
    except KeyboardInterrupt:
        took = time.monotonic() - t0
        assert took < 1.5, f"Ctrl-C ended the wait after {took:.1f} s"
    else:
        raise AssertionError("the wait was not interrupted")
np.testing.assert_array_equal(h.wait(), rank_sum(5))  # the collective went on
ok("interrupted wait")

# ---- 4. remove_process_set with a completed and a pending handle
if N >= 3:
    ps = gf.add_process_set([0, N - 1])
    if R in (0, N - 1):
        done = gf.collectives.allreduce_async(rank_values(), gf.Sum, "ps.done", process_set=ps)
        while not done.poll():
            time.sleep(0.01)
    pending = gf.collectives.allreduce_async(rank_values(), gf.Sum, "ps.pending",
                                             process_set=ps) \
        if R == 0 else None
    gf.barrier()
    gf.remove_process_set(ps)
    if R in (0, N - 1):
        np.testing.assert_array_equal(done.wait(), sum(
            np.arange(4, dtype=np.float32) * (r + 1) for r in (0, N - 1)))
    if R == 0:
        try:
            pending.wait()
        except gf.GradflowError as e:
            assert "was removed (remove_process_set)" in str(e), str(e)
        else:
            raise AssertionError("a pending handle of a removed set completed")
    ok("handles of a removed process set")

# ---- 5. a handle left pending by shutdown(), waited after it and after a new init()
if R == 0:
    time.sleep(0.3)  # rank 0 never submits "left": its peers' handles stay pending
    late = None
else:
    late = gf.collectives.allreduce_async(rank_values(), gf.Sum, "left")
gf.shutdown()
for when in ("after shutdown", "after a new init"):
    if late is not None:
        try:
            late.wait()
        except gf.GradflowError as e:
            assert "shutdown" in str(e) and "'left'" in str(e), (when, str(e))
        else:
            raise AssertionError(f"{when}: a pending handle completed")
        assert late.poll()
    if when == "after shutdown":
        gf.init()
ok("handles pending at shutdown")

gf.barrier()
print(f"handle corners OK rank {R} of {N}", flush=True)
sys.stdout.flush()
