# gradflow/tensorflow/__init__.py — public TensorFlow API: re-exports only.
# Shares the one gradflow runtime with gradflow (numpy) and gradflow.torch.
"""gradflow for TensorFlow 2: collectives on tf.Tensor (eager and tf.function),
`DistributedGradientTape`, `broadcast_variables`, `SyncBatchNormalization`.
See docs/tensorflow.md."""
from .ops import (Adasum, Average, Compression, GradflowError, Max, Min, Product, ReduceOp, Sum,
                  allgather, allreduce, alltoall, broadcast, cross_rank, cross_size, grouped_allreduce, init,
                  is_initialized, local_rank, local_size, mpi_comm, rank, reducescatter, shutdown,
                  size)
from .gradient_tape import DistributedGradientTape
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .functions import broadcast_variables
# Horovod has it here (horovod.tensorflow); it is a Keras layer, kept in gradflow.keras.
from ..keras.sync_batch_norm import SyncBatchNormalization

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_comm", "GradflowError", "ReduceOp", "Sum", "Average", "Min",
    "Max", "Product", "Adasum", "Compression", "allreduce", "grouped_allreduce", "allgather",
    "broadcast",
    "alltoall", "reducescatter", "DistributedGradientTape", "broadcast_variables",
    "SyncBatchNormalization",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]
