"""TensorFlow/Keras on one rank costs nothing (issue 16 target 2,
gradflow/one_rank.py): at N = 1 every DistributedOptimizer /
DistributedGradientTape mode trains bit for bit like plain Keras / TF and
sends nothing through the core (also Keras on the torch backend); in a 2-4
rank job a one-member process set takes that path while the other set still
reduces, against numpy."""
import importlib.util

import pytest

from _launch import run_mpi

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed")


def test_tf_keras_one_rank_is_plain_keras():
    # Small CSC chunks: through the core, sparse_ratio=0.01 would keep most of
    # these small gradients in the residual, so a lost fast path shows.
    out = run_mpi(1, "tf_one_rank_script.py", env={**TF_ENV, "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=400)
    assert out.stdout.count("tf one rank OK") == 6, out.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_one_member_process_set_takes_the_one_rank_path(n):
    # the last rank alone in a set, the others together (one at n = 2)
    out = run_mpi(n, "tf_one_rank_sets_script.py", env={**TF_ENV, "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=400)
    assert f"tf one rank sets OK on {n} ranks" in out.stdout, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_keras_torch_backend_one_rank_is_plain_keras():
    out = run_mpi(1, "keras_torch_one_rank_script.py",
                  env={**TF_ENV, "KERAS_BACKEND": "torch", "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=240)
    assert "keras torch one rank OK" in out.stdout, out.stdout
