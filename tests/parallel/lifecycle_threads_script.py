"""shutdown() from another thread: while threads wait on handles that never
complete, and while a 64 MiB ring allreduce runs. Every waiter wakes with a
GradflowError (or, for the ring, the right result), nothing crashes, init()
works again. Ends with a daemon thread left waiting in allreduce at exit:
the process must still exit 0, promptly."""
import sys
import threading
import time

import numpy as np

import gradflow as gf

BIG = 16 << 20  # float32 elements: 64 MiB


def expect_shutdown_error(h, errors):
    try:
        h.wait()
    except gf.GradflowError as e:
        errors.append(str(e))
    else:
        errors.append("no error")


# 1. Waiters on handles no other rank matches; another thread shuts down.
for rnd in range(3):
    gf.init()
    R, N = gf.rank(), gf.size()
    handles = [gf.allreduce_async(np.ones(8), name=f"lonely.{R}.{rnd}.{i}") for i in range(6)]
    errors = []
    waiters = [threading.Thread(target=expect_shutdown_error, args=(h, errors)) for h in handles]
    waiters += [threading.Thread(target=expect_shutdown_error, args=(handles[0], errors))]
    for t in waiters:
        t.start()
    time.sleep(0.3)
    stopper = threading.Thread(target=gf.shutdown)
    stopper.start()
    stopper.join(60)
    for t in waiters:
        t.join(60)
    assert not stopper.is_alive() and not any(t.is_alive() for t in waiters), "a thread hangs"
    assert len(errors) == len(waiters), errors
    assert all("shut" in e for e in errors), errors
    assert not gf.is_initialized()

# 1b. Threads submitting (and polling) as fast as they can while the main
#     thread shuts down: each stops with a GradflowError, nothing crashes.
def submit_until_error(tag, out):
    k = 0
    try:
        while True:
            h = gf.allreduce_async(np.ones(4), name=f"spin.{tag}.{k}")
            h.poll()
            k += 1
    except gf.GradflowError as e:
        out.append(str(e))


for rnd in range(3):
    gf.init()
    R = gf.rank()
    stops = []
    spinners = [threading.Thread(target=submit_until_error, args=(f"{R}.{rnd}.{i}", stops))
                for i in range(3)]
    for t in spinners:
        t.start()
    time.sleep(0.2)
    gf.shutdown()
    for t in spinners:
        t.join(60)
    assert not any(t.is_alive() for t in spinners), "a submitting thread hangs"
    assert len(stops) == len(spinners), stops

# 2. shutdown() from another thread while a 64 MiB ring allreduce runs.
gf.init()
R, N = gf.rank(), gf.size()
for rnd in range(2):
    x = np.full(BIG, R + 1.0, np.float32)
    outcome = []

    def run_big():
        try:
            outcome.append(gf.allreduce(x, op=gf.Sum, name=f"big.{rnd}"))
        except gf.GradflowError as e:
            outcome.append(e)

    t = threading.Thread(target=run_big)
    t.start()
    time.sleep(0.05 * (rnd + 1))
    gf.shutdown()
    t.join(60)
    assert not t.is_alive(), "the allreduce never returned after shutdown()"
    got = outcome[0]
    if isinstance(got, np.ndarray):  # it finished first: then it must be right
        np.testing.assert_array_equal(got[:: 1 << 16], np.float32(N * (N + 1) / 2))
    else:
        assert "shut" in str(got), got
    gf.init()
    got = gf.allreduce(np.full(1000, R + 1.0), op=gf.Sum, name=f"after.big.{rnd}")
    np.testing.assert_array_equal(got, np.full(1000, N * (N + 1) / 2))

# 3. A daemon thread waits in an allreduce no other rank submits; the main
#    thread returns. Exit must stop the runtime under it and not hang/crash.
def wait_forever():
    try:
        gf.allreduce(np.ones(4), name=f"daemon.{R}")
    except gf.GradflowError:
        pass


gf.barrier()
threading.Thread(target=wait_forever, daemon=True).start()
time.sleep(0.2)
if R == 0:
    print(f"threads OK on {N} ranks", flush=True)
sys.exit(0)
