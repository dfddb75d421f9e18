"""Handles the caller lets go of: dropped async handles, a grouped submit that
raises at its second tensor (none of it reaches the core), a group whose
first member fails (waited, or dropped in flight), two threads waiting on one
handle. The core must never write freed buffers (fresh arrays allocated
meanwhile keep their pattern) and must not keep results nobody waits for
(RSS stays flat over many rounds of dropped allgathers)."""
import gc
import os
import resource
import sys
import threading
import time

import numpy as np
import torch

import gradflow as gf
import gradflow.torch as hvd

gf.init()
R, N = gf.rank(), gf.size()
ELEMS = 1 << 14  # 64 KiB: below malloc's mmap threshold, so freed blocks get reused


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def fresh_patterns(k):
    """Allocate arrays likely to reuse just-freed blocks (numpy's and torch's),
    with a known pattern."""
    return [np.full(ELEMS, -7.0 - i, np.float32) for i in range(k)] + \
        [torch.full((ELEMS,), -7.0 - i).numpy() for i in range(k, 2 * k)]


def check_patterns(arrays, what):
    for i, a in enumerate(arrays):
        assert (a == -7.0 - i).all(), f"rank {R}: {what}: a freed buffer was written " \
                                      f"(array {i} changed)"


def check_normal(tag):
    got = gf.allreduce(np.full(1000, R + 1.0), op=gf.Sum, name=f"normal.{tag}")
    np.testing.assert_array_equal(got, np.full(1000, N * (N + 1) / 2))


# 1. Dropped allreduce handles: their output (and input) arrays go away at once.
for rnd in range(5):
    for i in range(32):
        gf.allreduce_async(np.ones(ELEMS, np.float32), op=gf.Sum, name=f"drop.{rnd}.{i}")
    patterns = fresh_patterns(64)
    gf.barrier()  # every dropped op has completed on every rank
    check_patterns(patterns, "dropped allreduce_async")
    check_normal(f"drop.{rnd}")

# 2. Dropped allgather handles: the core allocates their results; nobody waits.
big = np.full(1 << 16, R, np.float64)  # 512 KiB per rank per op
rss = []
for rnd in range(24):
    for i in range(16):
        gf.allgather_async(big, name=f"ag.drop.{rnd}.{i}")
    gc.collect()
    gf.barrier()
    rss.append(rss_mb())
grown = rss[-1] - rss[3]
# A leak would hold 20 rounds x 16 x N x 512 KiB (>= 320 MiB at N=2). Under
# AddressSanitizer (scripts/sanitize.sh) its quarantine keeps freed memory.
if "libasan" not in os.environ.get("LD_PRELOAD", ""):
    assert grown < 96, f"rank {R}: RSS grew {grown:.0f} MiB over dropped allgathers: {rss}"
check_normal("ag")

# 3. Grouped submit that raises at its second tensor: nothing was submitted.
for rnd in range(5):
    try:
        hvd.grouped_allreduce_async([torch.ones(ELEMS), "not a tensor"], op=hvd.Sum,
                                    name=f"grouped.bad.{rnd}")
    except TypeError:
        pass
    else:
        raise AssertionError("a non-tensor in a grouped allreduce was accepted")
    patterns = fresh_patterns(64)
    gf.barrier()
    check_patterns(patterns, "grouped submit that raised")
check_normal("grouped")

# 4. A group whose first tensor fails (shapes differ by rank): the other
#    ranks submit their group 1.5 s later, so rank 0's is in flight
#    meanwhile. Even rounds: rank 0 waits; the group's wait() raises the
#    shape error only once every member is done (_handles.wait_all), so
#    nothing of it is left in flight. Odd rounds: rank 0 drops the group at
#    once, in flight (its buffers must live until the core is done).
if N > 1:
    for rnd in range(4):
        name = f"grouped.fail.{rnd}"
        first = torch.ones(1) if R == 0 else torch.ones(2)
        if R != 0:
            time.sleep(1.5)
        group = hvd.grouped_allreduce_async([first, *[torch.ones(ELEMS) for _ in range(8)]],
                                            op=hvd.Sum, name=name)
        if R == 0 and rnd % 2:
            del group
            gc.collect()
        else:
            t0 = time.monotonic()
            try:
                group.wait()
            except gf.GradflowError as e:
                assert "shape" in str(e), e
            else:
                raise AssertionError("mismatched shapes did not raise")
            assert all(h.poll() for h in group.handles), "a member was left in flight"
            if R == 0:
                assert time.monotonic() - t0 > 1.0, "raised before the others submitted"
            del group
            gc.collect()
        patterns = fresh_patterns(64)
        gf.barrier()
        check_patterns(patterns, "group whose first member failed")
    check_normal("group.fail")

# 5. Two threads waiting on one handle: both get the result.
for rnd in range(3):
    h = gf.allreduce_async(np.full(10, R + 1.0), op=gf.Sum, name=f"twice.{rnd}")
    results = []
    threads = [threading.Thread(target=lambda: results.append(h.wait())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), f"rank {R}: a second waiter never returned"
    assert len(results) == 2
    for got in results:
        np.testing.assert_array_equal(got, np.full(10, N * (N + 1) / 2))

# 6. An optimizer dropped (with its model) while its pool buckets are in
#    flight: the pool buffer must outlive them. Rank 0 submits first; the
#    others come 0.5 s later, long after rank 0 has let go of everything.
if N > 1:
    for rnd in range(3):
        torch.manual_seed(rnd)
        model = torch.nn.Linear(127, 129)  # one pool of 16512 elements (64.5 KiB)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for step in range(2):  # step 2 builds the pool
            opt.zero_grad()
            model(torch.ones(4, 127)).sum().backward()
            opt.step()
        if R != 0:
            time.sleep(0.5)
        opt.zero_grad()
        model(torch.ones(4, 127)).sum().backward()  # buckets go out from the hooks
        del model, opt
        gc.collect()
        patterns = [torch.full((16512,), -7.0 - i) for i in range(64)]
        gf.barrier()
        for i, t in enumerate(patterns):
            assert (t == -7.0 - i).all(), f"rank {R}: a dropped optimizer's pool was written"
    check_normal("optimizer")

check_normal("end")
gf.shutdown()
if R == 0:
    print(f"handles OK on {N} ranks", flush=True)
sys.exit(0)
