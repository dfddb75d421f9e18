"""The examples, run the way the README says (`gradflowrun -np 2 python
examples/...`), reach the accuracy their issues promise on scikit-learn's
digits (>= 95 % test accuracy), and the synthetic benchmark reports its
images/s. Each run has a timeout; the accuracy is parsed from rank 0's output.
"""

import os
import re
import subprocess
import sys
import tempfile

import pytest

from _launch import ROOT, rank_env, run_cwd

EXAMPLES = os.path.join(ROOT, "examples")
TIMEOUT = 420


def run_example(name, *args):
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "-np", "2", sys.executable,
           os.path.join(EXAMPLES, name), *args]
    try:
        proc = subprocess.run(cmd, cwd=run_cwd(), env=rank_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out after {TIMEOUT} s\n{e.stdout}\n{e.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}\n{out[-4000:]}"
    return out


def accuracy(out):
    m = re.findall(r"test accuracy:? ([0-9.]+)", out)
    assert m, "no 'test accuracy' line in the output:\n" + out[-3000:]
    assert len(m) == 1, "test accuracy must be printed by rank 0 only:\n" + out[-3000:]
    print(f"test accuracy {m[0]}")  # shown with pytest -rP
    return float(m[0])


def _needs(module):
    try:
        __import__(module)
    except ImportError as e:  # pragma: no cover - [all] installs both frameworks
        pytest.skip(f"{module} is not installed: {e}")


def test_pytorch_digits_reaches_95_percent():
    _needs("torch")
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "ckpt.pt")
        out = run_example("pytorch_digits.py", "--checkpoint", ckpt)
        assert accuracy(out) >= 0.95, out[-3000:]
        assert os.path.exists(ckpt), "rank 0 must write the checkpoint"


def test_keras_digits_reaches_95_percent():
    _needs("tensorflow")
    with tempfile.TemporaryDirectory() as d:
        out = run_example("keras_digits.py", "--checkpoint", os.path.join(d, "best.keras"))
        assert accuracy(out) >= 0.95, out[-3000:]


def test_tensorflow2_digits_reaches_95_percent():
    _needs("tensorflow")
    out = run_example("tensorflow2_digits.py")
    assert accuracy(out) >= 0.95, out[-3000:]


def test_pytorch_synthetic_benchmark_reports_throughput():
    _needs("torch")
    out = run_example("pytorch_synthetic_benchmark.py", "--num-warmup-batches", "1",
                      "--num-batches-per-iter", "1", "--num-iters", "2", "--batch-size", "8")
    total = re.findall(r"Total img/sec on 2 rank\(s\): ([0-9.]+)", out)
    assert total and float(total[-1]) > 0, out[-3000:]


def test_lightning_digits_reaches_95_percent():
    _needs("lightning")
    _needs("tensorboard")
    with tempfile.TemporaryDirectory() as d:
        tb, root = os.path.join(d, "tb"), os.path.join(d, "root")
        out = run_example("lightning_digits.py", "--tensorboard", tb, "--root-dir", root)
        assert accuracy(out) >= 0.95, out[-3000:]
        ckpts = [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".ckpt")]
        assert len(ckpts) == 1, ckpts
        events = [f for _, _, fs in os.walk(tb) for f in fs if f.startswith("events.out")]
        assert len(events) == 1, events  # rank 0's StatsLogger only
