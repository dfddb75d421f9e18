"""gradflow: data-parallel training with GradientFlow communication.

Framework-free API (numpy): `init`, `rank`, `size`, the collectives and
their `_async` forms. `gradflow.torch`, `gradflow.tensorflow` and
`gradflow.keras` build on this; all share one native runtime.
"""
from ._runtime import (GradflowError, cross_rank, cross_size, init, is_initialized, local_rank,
                       local_size, mpi_comm, rank, reset_stats, shutdown, size, stats,
                       timeline_mark)
from .collectives import (Average, Max, Min, Product, ReduceOp, Sum, allgather, allgather_async,
                          allreduce, allreduce_async, alltoall, alltoall_async, barrier, broadcast,
                          broadcast_async, join, poll, reducescatter, reducescatter_async,
                          synchronize)
from .compression import Compression
from ._handles import Handle

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_comm", "stats", "reset_stats", "timeline_mark", "allreduce", "allreduce_async", "allgather",
    "allgather_async", "broadcast", "broadcast_async", "reducescatter", "reducescatter_async",
    "alltoall", "alltoall_async", "barrier", "join", "synchronize", "poll", "ReduceOp", "Sum",
    "Average", "Min", "Max", "Product", "Compression", "Handle", "GradflowError",
]
