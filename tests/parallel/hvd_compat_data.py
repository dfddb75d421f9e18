# tests/parallel/hvd_compat_data.py — the data and models shared by the
# unmodified Horovod scripts (hvd_torch_compat_script.py,
# hvd_keras_compat_script.py) and their single-process reference
# (hvd_compat_reference.py). Imports no gradflow and no horovod.
import numpy as np

SAMPLES, FEATURES = 96, 8      # 96 divides evenly over 1, 2, 3, 4 ranks
BATCH = 8                      # per-rank batch size
EPOCHS = 3
BASE_LR = 0.05                 # the script uses BASE_LR * size (Horovod's rule)


def regression_data():
    """A fixed regression problem: x (SAMPLES, FEATURES), y (SAMPLES, 1), float32."""
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32)
    w = rng.standard_normal((FEATURES, 1)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.1 * rng.standard_normal((SAMPLES, 1))).astype(np.float32)
    return x, y


def torch_model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


def keras_model(seed):
    import keras
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(1)])
