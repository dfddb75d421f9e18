# gradflow.torch — the PyTorch binding, a drop-in for horovod.torch:
# `import gradflow.torch as hvd`. Re-exports only; the tensor collectives are
# in ops.py, grouped_ops.py and scatter_ops.py, model/optimizer state helpers in functions.py,
# the DistributedOptimizer in optimizer.py, FusedLinear in fused_linear.py, SyncBatchNorm in
# sync_batch_norm.py, StatsLogger (TensorBoard) in stats_logger.py and
# elastic training (hvd.elastic) in elastic.py.
"""PyTorch binding of gradflow with Horovod's API (``import gradflow.torch as hvd``)."""
from .._runtime import (GradflowError, cross_rank, cross_size, init, is_initialized, local_rank,
                        local_size, mpi_comm, rank, reset_stats, shutdown, size, stats)
from .._basics import (HorovodInternalError, HostsUpdatedInterrupt, ccl_built, cuda_built,
                       ddl_built, gloo_built, gloo_enabled, is_homogeneous, mpi_built, mpi_enabled,
                       mpi_threads_supported, nccl_built, rocm_built, sycl_built, start_timeline,
                       stop_timeline)
from ..collectives import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .compression import Compression, Compressor
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                  allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
                  broadcast_async, broadcast_async_, join, poll, sparse_allreduce_async,
                  synchronize)
from .grouped_ops import (grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                          grouped_allreduce_async_)
from .distributed_optimizer import DistributedOptimizer
from .fused_linear import FusedLinear, fuse_linear_grad_accumulation
from .scatter_ops import (grouped_allgather, grouped_allgather_async, grouped_reducescatter,
                          grouped_reducescatter_async, reducescatter, reducescatter_async)
from .sync_batch_norm import SyncBatchNorm
from .stats_logger import StatsLogger

from . import elastic  # noqa: E402,F401 - hvd.elastic.run, as in Horovod

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "mpi_comm", "stats", "reset_stats", "GradflowError", "ReduceOp", "Average", "Sum",
    "Min", "Max", "Product", "Adasum", "Compression", "Compressor", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_allgather", "grouped_allgather_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "synchronize", "poll", "join",
    "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "FusedLinear", "fuse_linear_grad_accumulation", "SyncBatchNorm", "StatsLogger", "HorovodInternalError", "HostsUpdatedInterrupt", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built",
    "start_timeline", "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]
