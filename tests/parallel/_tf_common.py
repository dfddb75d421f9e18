# _tf_common.py — shared preamble of the TensorFlow/Keras SPMD test scripts:
# quiet, single-threaded TensorFlow with Keras on its TensorFlow backend, and
# the small Keras classifier the one-rank scripts train. Import it before
# anything imports TensorFlow: the environment and thread settings only take
# effect before TensorFlow loads and starts its runtime.
"""Helpers for tests/parallel/tf_*_script.py (run under mpiexec)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")
import keras  # noqa: E402

__all__ = ["keras", "small_classifier", "tf"]


def small_classifier(seed: int) -> keras.Model:
    """10 features -> 8 (relu) -> 3 logits, its initial weights drawn from `seed`."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])
