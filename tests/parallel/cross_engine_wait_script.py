"""Waits that cycle through two engines (Note [Waits across engines],
native/engine_links.h), run by test_cross_engine_waits.py on 3 or 4 ranks.

Set A = {0, 1}. argv[1] picks the case:
- "cycle": rank 0 runs a global allreduce then one on A, rank 1 the other
  way round, the other ranks the global one only. Neither engine sees all
  its members blocked on it; the job used to hang for ever. Every rank must
  raise GradflowError (the job aborts) within 1.5 x GRADFLOW_TIMEOUT (+
  slack), naming the global set's pending name. argv[2] "cached": first
  two rounds in a consistent order (checked against numpy), so both names
  wait on the response cache when the cycle comes.
- "progress": ranks 0 and 3 wait on a global allreduce for 1.6 x
  GRADFLOW_TIMEOUT while ranks 1 and 2 keep running allreduces on set
  B = {1, 2}, each with a second thread waiting the whole time on a B name
  the other submits only at the end: every rank is always blocked in a
  wait, but B moves, so nothing may fail.
- "straggler": rank 0 waits on the global allreduce, rank 1 waits on set
  B = {1, 2}, and rank 2 computes (sleeps) 1.6 x GRADFLOW_TIMEOUT before it
  takes part: rank 2 is not blocked, so nothing may fail.
- "setfirst": ranks 0 and 1 wait on set A under names that differ (a
  mismatch only A's own bounded wait can end), the others on a global
  allreduce that ranks 0 and 1 join after. A fails its names after
  GRADFLOW_TIMEOUT (a per-name GradflowError, caught), before the job-wide
  check (1.5 x) could abort; then the global allreduce completes (numpy).
- "torch": two models, one with a DistributedOptimizer on the global set,
  one on A; rank 0 runs backward of the global model first, rank 1 of the
  set model first (each optimizer waits when its backward returns): every
  rank must raise.
Prints "rank R raised after T s: ..." or "rank R: <case> OK".
"""
import os
import sys
import time

import numpy as np

import gradflow as gf

case = sys.argv[1]
cached = len(sys.argv) > 2 and sys.argv[2] == "cached"
gf.init()
R, N = gf.rank(), gf.size()
TIMEOUT = float(os.environ.get("GRADFLOW_TIMEOUT", "60"))
A = gf.add_process_set([0, 1])
B = gf.add_process_set([1, 2])


def x(tag, rank):
    """This rank's distinct input for collective `tag`."""
    return np.arange(5, dtype=np.float32) * (rank + 1) + tag


def expect_sum(tag, ranks):
    return sum(x(tag, r) for r in ranks)


def check(got, tag, ranks):
    # Summation order may differ from numpy's; ranks must agree bitwise
    # (checked below through an allgather).
    np.testing.assert_allclose(got, expect_sum(tag, ranks), rtol=1e-6)
    every = gf.allgather(got[None, :], name=f"check.{tag}")
    assert all((row == got).all() for row in every), every


def report(t0, e):
    msg = str(e).replace("\n", " ")
    sys.stdout.flush()
    # One write per line: mpiexec interleaves ranks' output at write boundaries.
    os.write(1, f"rank {R} raised after {time.time() - t0:.2f} s: {msg}\n".encode())


def leave_after_the_others_reported():
    """The job was aborted (gradflow exits without MPI_Finalize): give the
    other ranks time to get and print their error before this rank's exit
    makes the launcher end them."""
    time.sleep(3)
    sys.exit(7)


def both_in_order(tag):
    """Every rank: the global allreduce, then (members) A's."""
    g = gf.allreduce(x(tag, R), op=gf.Sum, name="g")
    check(g, tag, range(N))
    if R in (0, 1):
        a = gf.allreduce(x(tag + 100, R), op=gf.Sum, name="a", process_set=A)
        np.testing.assert_allclose(a, expect_sum(tag + 100, [0, 1]), rtol=1e-6)


if case == "cycle":
    if cached:
        for tag in (1, 2):
            both_in_order(tag)
    t0 = time.time()
    try:
        if R == 0:
            gf.allreduce(x(3, R), op=gf.Sum, name="g")
            gf.allreduce(x(3, R), op=gf.Sum, name="a", process_set=A)
        elif R == 1:
            gf.allreduce(x(3, R), op=gf.Sum, name="a", process_set=A)
            gf.allreduce(x(3, R), op=gf.Sum, name="g")
        else:
            gf.allreduce(x(3, R), op=gf.Sum, name="g")
        print(f"rank {R}: no error", flush=True)
        sys.exit(5)
    except gf.GradflowError as e:
        report(t0, e)
    leave_after_the_others_reported()
elif case == "progress":
    import threading

    t0 = time.time()
    if R in (1, 2):
        # A thread of each waits all along on a name the other rank submits
        # at the end (so no sampling gap lets the global engine see it idle).
        late = {}
        early = gf.allreduce_async(x(10 + R, R), op=gf.Sum, name=f"last.{R}", process_set=B)
        waiter = threading.Thread(target=lambda: late.update(got=gf.synchronize(early)))
        waiter.start()
        rounds = 0
        while True:
            # Both ranks run the same number of rounds (the Min of their clocks' say).
            go = np.array([time.time() - t0 < 1.6 * TIMEOUT], dtype=np.float32)
            if not gf.allreduce(go, op=gf.Min, name="b.go", process_set=B)[0]:
                break
            got = gf.allreduce(x(rounds, R), op=gf.Sum, name="b", process_set=B)
            np.testing.assert_allclose(got, expect_sum(rounds, [1, 2]), rtol=1e-6)
            rounds += 1
        assert rounds > 10, rounds
        other = 3 - R
        gf.allreduce(x(10 + other, R), op=gf.Sum, name=f"last.{other}", process_set=B)
        waiter.join()
        np.testing.assert_allclose(late["got"], x(10 + R, R) + x(10 + R, other), rtol=1e-6)
    g = gf.allreduce(x(7, R), op=gf.Sum, name="g")
    check(g, 7, range(N))
    print(f"rank {R}: progress OK after {time.time() - t0:.1f} s", flush=True)
elif case == "straggler":
    t0 = time.time()
    if R == 2:
        time.sleep(1.6 * TIMEOUT)  # computing: not blocked in gradflow
    if R in (1, 2):
        b = gf.allreduce(x(8, R), op=gf.Sum, name="b", process_set=B)
        np.testing.assert_allclose(b, expect_sum(8, [1, 2]), rtol=1e-6)
    g = gf.allreduce(x(9, R), op=gf.Sum, name="g")
    check(g, 9, range(N))
    print(f"rank {R}: straggler OK after {time.time() - t0:.1f} s", flush=True)
elif case == "setfirst":
    t0 = time.time()
    if R in (0, 1):
        try:
            gf.allreduce(x(5, R), op=gf.Sum, name=f"differs.{R}", process_set=A)
            print(f"rank {R}: no error", flush=True)
            sys.exit(5)
        except gf.GradflowError as e:
            assert "GRADFLOW_TIMEOUT" in str(e) and "aborting" not in str(e), e
            assert time.time() - t0 < 1.4 * TIMEOUT, time.time() - t0
    g = gf.allreduce(x(6, R), op=gf.Sum, name="g")
    check(g, 6, range(N))
    print(f"rank {R}: setfirst OK after {time.time() - t0:.1f} s", flush=True)
elif case == "torch":
    import torch

    torch.manual_seed(0)
    glob_model = torch.nn.Linear(4, 3)
    set_model = torch.nn.Linear(4, 2)
    import gradflow.torch as gft

    glob_opt = gft.DistributedOptimizer(
        torch.optim.SGD(glob_model.parameters(), lr=0.1),
        named_parameters=glob_model.named_parameters(prefix="glob"))
    set_opt = None
    if R in (0, 1):
        set_opt = gft.DistributedOptimizer(
            torch.optim.SGD(set_model.parameters(), lr=0.1),
            named_parameters=set_model.named_parameters(prefix="set"), process_set=A)
    data = torch.full((2, 4), float(R + 1))

    def step(model, opt):
        opt.zero_grad()
        model(data).sum().backward()  # waits for the reduction (as DDP)
        opt.step()

    t0 = time.time()
    try:
        if R == 1:
            step(set_model, set_opt)
            step(glob_model, glob_opt)
        else:
            step(glob_model, glob_opt)
            if R == 0:
                step(set_model, set_opt)
        print(f"rank {R}: no error", flush=True)
        sys.exit(5)
    except gf.GradflowError as e:
        report(t0, e)
    leave_after_the_others_reported()
else:
    raise SystemExit(f"unknown case {case}")
gf.shutdown()
