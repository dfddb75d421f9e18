# gradflow/tensorflow/keras/__init__.py — Horovod's module path
# (horovod.tensorflow.keras) for gradflow.keras: a thin alias, same objects.
# `gradflow.tensorflow.keras.callbacks` / `.elastic` are gradflow.keras's modules themselves.
"""`import gradflow.tensorflow.keras as hvd`: the same API as gradflow.keras
(Horovod's horovod.tensorflow.keras and horovod.keras both map to it)."""
import sys as _sys

from ...keras import *  # noqa: F401,F403
from ...keras import __all__, callbacks, elastic  # noqa: F401

# `from gradflow.tensorflow.keras.callbacks import ...` (and .elastic) work as with Horovod.
_sys.modules[__name__ + ".callbacks"] = callbacks
_sys.modules[__name__ + ".elastic"] = elastic
