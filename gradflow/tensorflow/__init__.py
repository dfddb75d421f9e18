# gradflow/tensorflow/__init__.py — public TensorFlow API: re-exports only.
# Shares the one gradflow runtime with gradflow (numpy) and gradflow.torch.
"""gradflow for TensorFlow 2: collectives on tf.Tensor (eager and tf.function),
`DistributedGradientTape`, `PartialDistributedGradientTape`,
`broadcast_variables`, object broadcast/allgather, `SyncBatchNormalization`,
process sets. See docs/tensorflow.md."""
from .._basics import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled,
                       is_homogeneous, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                       rocm_built, sycl_built, start_timeline, stop_timeline)
from .ops import (Adasum, Average, Compression, GradflowError, Max, Min, Product, ReduceOp, Sum,
                  allgather, allreduce, alltoall, broadcast, broadcast_, cross_rank, cross_size,
                  grouped_allreduce, init, is_initialized, join, local_rank, local_size, mpi_comm,
                  rank, shutdown, size)
from .scatter_ops import grouped_allgather, grouped_reducescatter, reducescatter
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .runtime_ops import (DistributedOptimizer, local_rank_op, local_size_op,
                          process_set_included_op, rank_op, size_op)
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .functions import (allgather_object, broadcast_global_variables, broadcast_object,
                        broadcast_object_fn, broadcast_variables)
# Horovod has it here (horovod.tensorflow); it is a Keras layer, kept in gradflow.keras.
from ..keras.sync_batch_norm import SyncBatchNormalization
from . import elastic  # hvd.elastic.run / TensorFlowState / TensorFlowKerasState, as Horovod

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_comm", "GradflowError", "ReduceOp", "Sum", "Average", "Min",
    "Max", "Product", "Adasum", "Compression", "allreduce", "grouped_allreduce", "allgather",
    "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
    "grouped_reducescatter", "join", "DistributedGradientTape", "PartialDistributedGradientTape",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
    "allgather_object", "DistributedOptimizer", "rank_op", "local_rank_op", "size_op",
    "local_size_op", "process_set_included_op", "SyncBatchNormalization",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built",
    "start_timeline", "stop_timeline",
]
