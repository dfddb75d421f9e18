# shim/horovod/__init__.py — the `horovod` package seen by an unmodified
# Horovod script in gradflow's compatibility mode. This directory is put on
# sys.path only when compatibility mode is on (gradflowrun --horovod-compat,
# or GRADFLOW_HOROVOD_COMPAT=1 with the .pth hook); it holds no other module:
# every `horovod.<sub>` import is served by gradflow.horovod_compat's finder.
"""Horovod, as provided by gradflow's compatibility mode: `horovod.torch`,
`horovod.tensorflow`, `horovod.tensorflow.keras` and `horovod.keras` are
gradflow's modules (see docs/horovod_compat.md)."""
from gradflow.horovod_compat import HOROVOD_API_VERSION, install_finder

# Scripts compare horovod.__version__ against Horovod releases: report the
# Horovod API level gradflow follows, and gradflow's own version beside it.
__version__ = HOROVOD_API_VERSION
from gradflow import __version__ as __gradflow_version__  # noqa: E402

install_finder()

# horovod.run (Horovod's programmatic launcher, e.g. the --num-proc branch of
# its pytorch_mnist.py example): gradflow.runner.run, same arguments.
from gradflow.runner.run_func import run  # noqa: E402,F401
