"""gradflow: data-parallel training with GradientFlow communication.

Framework-free API (numpy): `init`, `rank`, `size`, the collectives and
their `_async` forms, and Horovod's process sets (`ProcessSet`,
`add_process_set`, `remove_process_set`, `process_set=` on every
collective). `gradflow.torch`, `gradflow.tensorflow` and `gradflow.keras`
build on this; all share one native runtime.
"""
import importlib.util as _importlib_util
import os as _os


def _native_missing_message() -> str:
    """Why `import gradflow` found a package without its compiled extension,
    and what to do instead (usually: Python was started in the source tree)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    installed = ""
    try:
        from importlib import metadata
        dist = metadata.distribution("gradflow")
        where = _os.path.abspath(str(dist.locate_file("gradflow")))
        if where != here:
            installed = f" An installed gradflow is at {where}."
    except Exception:  # no installed distribution, or unreadable metadata
        pass
    return (f"gradflow: the compiled extension gradflow._native is missing in {here}. "
            "This is probably the source tree (Python puts the current directory first on "
            "sys.path), not the installed package." + installed + " Run Python from another "
            "directory to use the installed gradflow, or build the source tree in place "
            "with `python setup.py build_ext --inplace`.")


if _importlib_util.find_spec(__name__ + "._native") is None:
    raise ImportError(_native_missing_message(), name=__name__ + "._native")

from ._runtime import (GradflowError, cross_rank, cross_size, init, is_initialized, local_rank,
                       local_size, mpi_comm, rank, reset_stats, shutdown, size, stats,
                       timeline_mark)
from .collectives import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, allgather,
                          allgather_async, allreduce, allreduce_async, alltoall, alltoall_async,
                          barrier, broadcast, broadcast_async, join, poll, reducescatter,
                          reducescatter_async, synchronize)
from .compression import Compression
from ._basics import (HorovodInternalError, HostsUpdatedInterrupt, ccl_built, cuda_built,
                      ddl_built, gloo_built, gloo_enabled, is_homogeneous, mpi_built, mpi_enabled,
                      mpi_threads_supported, nccl_built, rocm_built, sycl_built, start_timeline,
                      stop_timeline)
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ._handles import Handle
from . import _runtime as _runtime_module
from .runner import notice as _notice
from .runner.run_func import run  # Horovod's horovod.run: a function on N new ranks

# Under gradflowrun: when the launcher reports a dead peer, pending and later
# waits fail at once with its message instead of after GRADFLOW_TIMEOUT.
_notice.watch(_runtime_module.on_peer_failure_notice)

__version__ = "0.1.0"

__all__ = [
    "run", "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_comm", "stats", "reset_stats", "timeline_mark", "allreduce", "allreduce_async", "allgather",
    "allgather_async", "broadcast", "broadcast_async", "reducescatter", "reducescatter_async",
    "alltoall", "alltoall_async", "barrier", "join", "synchronize", "poll", "ReduceOp", "Sum",
    "Average", "Adasum", "Min", "Max", "Product", "Compression", "Handle", "GradflowError",
    "HorovodInternalError", "HostsUpdatedInterrupt", "is_homogeneous", "mpi_threads_supported",
    "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "sycl_built", "start_timeline", "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]
