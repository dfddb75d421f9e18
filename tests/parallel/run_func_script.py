# run_func_script.py — the driver side of test_run_func.py: calls
# gradflow.runner.run (Horovod's horovod.run) from Python, which launches
# jobs of its own, and checks every rank's return value against numpy /
# plain torch. argv[1]: numpy | torch | compat (horovod.run through the
# compatibility shim, which must be on PYTHONPATH) | sleep (Ctrl-C: a job that
# never ends, the test interrupts it). Prints "<case> OK" per case.
import argparse
import io
import os
import sys
import warnings

import _launch  # beside this script: imported by the ranks through the driver's sys.path

import numpy as np

CASE = sys.argv[1]


SCALE = 2.0  # a module global of __main__, read by habits() on the ranks


def summed(scale, offset=0.0):
    """Each rank's allreduce of arange(5) * (rank + 1) * scale, plus offset
    (scale: a number, or an argparse Namespace with .scale, as the examples pass)."""
    import gradflow as gf
    gf.init()
    scale = getattr(scale, "scale", scale)
    out = gf.allreduce(np.arange(5, dtype=np.float32) * (gf.rank() + 1) * scale, op=gf.Sum)
    rank = gf.rank()
    gf.shutdown()
    return rank, out + offset


def raises_on_rank_1():
    import gradflow as gf
    gf.init()
    if gf.rank() == 1:
        raise KeyError("boom on rank 1")
    gf.allreduce(np.ones(2, np.float32), name="never")


def habits():
    """What users' functions do: print (a progress bar's carriage return
    too), read __main__'s globals, a module found through the driver's
    sys.path and GRADFLOW_* settings; rank 0 ends with sys.exit()."""
    import gradflow as gf
    gf.init()
    print(f"bar {gf.rank()} 1/2\rbar {gf.rank()} 2/2", flush=True)
    seen = (SCALE, os.path.basename(_launch.HERE), os.environ.get("GRADFLOW_CYCLE_TIME"),
            os.environ.get("GRADFLOW_FUSION_THRESHOLD"))
    rank = gf.rank()
    gf.shutdown()
    if rank == 0:
        sys.exit()
    return seen


def unpicklable_on_rank_1():
    import threading
    import gradflow as gf
    gf.init()
    return threading.Lock() if gf.rank() == 1 else 0


def nested():
    from gradflow.runner import run
    return run(summed, args=(1.0,), num_proc=2)


def sleeper():
    import time
    import gradflow as gf
    gf.init()
    print(f"sleeping {os.getpid()}", flush=True)
    time.sleep(120)


def train_torch(steps):
    """Linear regression, each rank its shard of 12 samples, SGD through
    gradflow's DistributedOptimizer; returns the final weights."""
    import torch
    import gradflow.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 3, generator=g), torch.randn(12, 1, generator=g)
    shard = slice(hvd.rank() * 12 // hvd.size(), (hvd.rank() + 1) * 12 // hvd.size())
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def reference_torch(steps, n):
    """The same training in one process: the average of the shards' gradients."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 3, generator=g), torch.randn(12, 1, generator=g)
    for _ in range(steps):
        opt.zero_grad()
        for r in range(n):
            s = slice(r * 12 // n, (r + 1) * 12 // n)
            (torch.nn.functional.mse_loss(model(x[s]), y[s]) / n).backward()
        opt.step()
    return [p.detach().numpy() for p in model.parameters()]


if CASE == "numpy":
    from gradflow.runner import run
    for n in (2, 3):  # the examples' habits: argparse args, hosts, verbose=2
        got = run(summed, args=(argparse.Namespace(scale=2.0),), kwargs={"offset": 1.0},
                  num_proc=n, hosts=f"localhost:{n}", verbose=2)
        want = np.arange(5, dtype=np.float32) * 2.0 * sum(range(1, n + 1)) + 1.0
        assert [r for r, _ in got] == list(range(n)), got  # index = rank
        for _, v in got:
            assert v.tobytes() == got[0][1].tobytes(), got  # bitwise alike
            np.testing.assert_array_equal(v, want)
        print(f"values {n} OK", flush=True)
    try:
        run(raises_on_rank_1, num_proc=2)
    except RuntimeError as e:
        text = str(e)
        assert "raised on rank 1" in text and "KeyError: 'boom on rank 1'" in text, text
        print("raises OK", flush=True)
    else:
        raise AssertionError("no error from a rank that raised")
    base = 40
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a closure (cloudpickle by value); np counts when num_proc is 1, as in Horovod
        assert run(lambda: base + 2, num_proc=1, np=2) == [42, 42]
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught
    print("lambda OK", flush=True)
    os.environ["GRADFLOW_CYCLE_TIME"] = "7"  # the driver's settings reach the ranks
    real, sys.stdout = sys.stdout, io.StringIO()  # a notebook's replaced stdout
    try:
        got = run(habits, num_proc=2, extra_args=["--fusion-threshold-mb", "2"])
        shown = sys.stdout.getvalue()
    finally:
        sys.stdout = real
    assert got == [None, (2.0, "parallel", "7", str(2 << 20))], got
    assert "[1]<stdout>: bar 1 1/2\r" in shown and "[1]<stdout>: bar 1 2/2\n" in shown, shown
    print("habits OK", flush=True)
    try:
        run(unpicklable_on_rank_1, num_proc=2)
    except RuntimeError as e:
        assert "rank 1's function returned a value that cannot be pickled" in str(e), str(e)
        assert "lock" in str(e), str(e)
    else:
        raise AssertionError("no error for a return value that cannot be pickled")
    try:
        run(nested, num_proc=2)
    except RuntimeError as e:
        assert "raised on rank" in str(e) and "inside a rank of a running job" in str(e), str(e)
    else:
        raise AssertionError("no error for run() inside a rank")
    print("unpicklable nested OK", flush=True)
    import threading
    for kwargs, text in (({"num_proc": 0}, "positive int"),
                         ({"num_proc": 2, "hosts": "localhost:1,nosuchhost-gf:1"},
                          "this machine only"),
                         ({"num_proc": 2, "min_num_proc": 1}, "elastic"),
                         ({"num_proc": 2, "use_gloo": True}, "MPI only"),
                         ({"num_proc": 2, "args": (threading.Lock(),)}, "cannot pickle")):
        try:
            run(summed, **kwargs)
        except ValueError as e:
            assert text in str(e), (kwargs, str(e))
        else:
            raise AssertionError(f"no ValueError for {kwargs}")
    print("refusals OK", flush=True)
elif CASE == "torch":
    from gradflow.runner import run
    for n in (2, 3):
        got = run(train_torch, args=(4,), num_proc=n)
        want = reference_torch(4, n)
        for rank_params in got:
            for p, q, w in zip(rank_params, got[0], want):
                assert p.tobytes() == q.tobytes(), "ranks differ"
                np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-6)
        print(f"torch {n} OK", flush=True)
elif CASE == "sleep":
    from gradflow.runner import run
    run(sleeper, num_proc=2)
elif CASE == "compat":
    import horovod  # the compatibility shim (PYTHONPATH)
    assert horovod.__version__ == "0.28.1", horovod.__version__
    got = horovod.run(summed, args=(1.0,), num_proc=2, use_mpi=True)
    np.testing.assert_array_equal(got[1][1], np.arange(5, dtype=np.float32) * 3.0)
    print("compat OK", flush=True)
else:
    raise SystemExit(f"unknown case {CASE}")
