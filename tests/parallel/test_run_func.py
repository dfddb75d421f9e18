"""gradflow.runner.run, Horovod's horovod.run: a Python function run on N
new ranks, their return values back in rank order (run_func_script.py is
the driver; each case launches its own jobs). Values against numpy and
plain torch, ranks bitwise alike, at 2 and 3 ranks; a rank that raises, and
the refused arguments, with default settings; users' habits (argparse
args, hosts, verbose=2, __main__ globals, sys.exit(), a replaced stdout,
GRADFLOW_* settings, extra_args), a value that cannot be pickled, run()
inside a rank, Ctrl-C."""
import os
import signal
import subprocess
import sys
import time

import pytest

from _launch import ROOT, rank_env, run_cwd

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(ROOT, "gradflow", "horovod_compat", "shim")


def drive(case, env=None, timeout=240):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "run_func_script.py"), case],
                          env=env or rank_env(), cwd=run_cwd(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def test_values_errors_and_refusals():
    out = drive("numpy")
    for line in ("values 2 OK", "values 3 OK", "raises OK", "lambda OK", "habits OK",
                 "unpicklable nested OK", "refusals OK"):
        assert line in out, out


def test_torch_training_equals_plain_torch():
    pytest.importorskip("torch")
    out = drive("torch")
    assert "torch 2 OK" in out and "torch 3 OK" in out, out


def test_horovod_run_in_compatibility_mode():
    env = rank_env()
    env["PYTHONPATH"] = SHIM + os.pathsep + env.get("PYTHONPATH", "")
    assert "compat OK" in drive("compat", env)


def test_ctrl_c_in_the_driver_ends_the_ranks():
    """A notebook's interrupt reaches the driver only: the job must end,
    its ranks with it, and KeyboardInterrupt comes back."""
    env = rank_env()
    env["PYTHONFAULTHANDLER"] = "1"  # for _stuck_job_report
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "run_func_script.py"), "sleep"],
                            env=env, cwd=run_cwd(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pids = []
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            if "sleeping" in line:
                pids.append(int(line.split()[-1]))
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Seen once in CI (2026-11-29 16:43, loaded machine; never here
            # in 20 runs): say what still runs and where each Python process
            # of the job is (PYTHONFAULTHANDLER: SIGABRT dumps its threads).
            raise AssertionError(_stuck_job_report(proc)) from None
    finally:
        proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)  # gradflowrun stopped them; give the exits a moment
    assert not any(_running(pid) for pid in pids), f"rank processes {pids} still run"


def _stuck_job_report(proc) -> str:
    """What still runs under the driver `proc`, and every Python process's
    stacks there (SIGABRT, faulthandler), then everything is killed."""
    rows = [line.split(None, 3) for line in subprocess.run(
        ["ps", "-ww", "-eo", "pid,ppid,etimes,args"], capture_output=True, text=True).stdout.splitlines()[1:]]
    children = {}
    for pid, ppid, _, _ in rows:
        children.setdefault(int(ppid), []).append(int(pid))
    job, todo = [], [proc.pid]
    while todo:
        job.append(todo.pop())
        todo.extend(children.get(job[-1], []))
    alive = "\n".join(" ".join(r) for r in rows if int(r[0]) in job)
    for pid in job:
        if any(int(r[0]) == pid and "python" in r[3] for r in rows):
            _signal_quietly(pid, signal.SIGABRT)
    time.sleep(2)
    for pid in job:
        _signal_quietly(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired as e:
        err = str(e.stderr)
    return (f"the driver did not end within 60 s of SIGINT; still running:\n{alive}\n"
            f"stderr (stacks after SIGABRT):\n{err[-6000:]}")


def _signal_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
