"""SyncBatchNorm (issue 14) under mpiexec: gradflow.torch.SyncBatchNorm and
gradflow.tensorflow / gradflow.keras SyncBatchNormalization against the
framework's plain batch norm on the concatenated global batch (equal, unequal
and empty local batches), moving statistics, gradients, and short distributed
training runs that must match single-process training and stay bitwise
identical across ranks."""
import importlib.util

import pytest

from _launch import run_mpi

no_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                              reason="torch is not installed")
no_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                           reason="tensorflow is not installed")


def _oks(out, n):
    return [line for line in out.stdout.splitlines()
            if line.startswith("ok ") and f"(size {n})" in line]


@no_torch
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_torch_sync_batch_norm(n):
    # n=1 checks the single-rank fallback (plain F.batch_norm) against the same references;
    # from 3 ranks on, process_set= with two disjoint sets (4: two sets of two)
    out = run_mpi(n, "sync_bn_torch_script.py", timeout=300)
    assert len(_oks(out, n)) == (8 if n >= 3 else 7), out.stdout


TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}


@no_tf
@pytest.mark.parametrize("n", [1, 2, 3])
def test_keras_sync_batch_normalization(n):
    # eager, tf.function and model.fit; n=1 checks the plain-Keras fallback
    out = run_mpi(n, "sync_bn_keras_script.py", env=TF_ENV, timeout=600)
    assert len(_oks(out, n)) == 6, out.stdout


@no_tf
@no_torch
def test_keras_sync_batch_normalization_torch_backend():
    # the same layer on Keras's torch backend (allreduce through gradflow.torch)
    out = run_mpi(2, "sync_bn_keras_script.py", env={**TF_ENV, "KERAS_BACKEND": "torch"},
                  timeout=600)
    assert len(_oks(out, 2)) == 5, out.stdout


@no_tf
@pytest.mark.parametrize("n", [3, 4])
def test_keras_sync_batch_normalization_process_sets(n):
    # process_set=: each set's global batch is its own members' (eager and
    # tf.function), a layer one set alone has, a non-member's error and inference
    out = run_mpi(n, "sync_bn_keras_sets_script.py", env=TF_ENV, timeout=600)
    assert f"keras sync batch norm process sets OK on {n} ranks" in out.stdout, out.stdout
