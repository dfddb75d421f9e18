"""TensorFlow/Keras gradient reduction overlapped with backward inside
tf.function (gradflow/tensorflow/overlap.py) on 2 and 3 ranks: graph structure,
numbers against numpy, bitwise identical on every rank (fp32 and fp16 wire,
None and IndexedSlices gradients, Keras compiled step, the off switch)."""
import importlib.util

import pytest

from _launch import run_mpi

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "2",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed")


@pytest.mark.parametrize("ranks", [2, 3])
def test_tf_overlapped_gradient_reduction(ranks):
    out = run_mpi(ranks, "tf_overlap_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("tf overlap OK") == ranks, out.stdout
