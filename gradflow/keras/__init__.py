# gradflow/keras/__init__.py — public Keras 3 API: re-exports only.
# Shares the one gradflow runtime with gradflow.tensorflow and gradflow.torch.
"""gradflow for Keras 3: (Partial)DistributedOptimizer, callbacks,
SyncBatchNormalization, Horovod's Keras-level value collectives and
load_model. See docs/tensorflow.md."""
from .._runtime import (GradflowError, cross_rank, cross_size, init, is_initialized, local_rank,
                        local_size, rank, shutdown, size)
from .._basics import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,
                       mpi_enabled, mpi_threads_supported, nccl_built, rocm_built, sycl_built,
                       start_timeline, stop_timeline)
from ..collectives import Adasum, Average, Sum
from ..compression import Compression
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,
                        LearningRateScheduleCallback, LearningRateWarmupCallback,
                        MetricAverageCallback, SparseWarmupCallback, broadcast_keras_variables)
from .functions import (allgather, allreduce, broadcast, broadcast_global_variables, load_model,
                        reducescatter)
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, is_distributed
from .sync_batch_norm import SyncBatchNormalization
from .stats_callback import TensorBoardStatsCallback
from .epoch_agreement import EpochAgreementCallback
from . import elastic  # noqa: E402  (hvd.elastic.KerasState, ... as in Horovod)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "GradflowError", "Average", "Sum", "Compression", "DistributedOptimizer", "is_distributed",
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint", "SparseWarmupCallback",
    "broadcast_keras_variables", "cross_rank", "cross_size", "Adasum",
    "PartialDistributedOptimizer", "allreduce", "allgather", "broadcast", "reducescatter",
    "broadcast_global_variables", "load_model", "callbacks", "elastic",
    "SyncBatchNormalization", "TensorBoardStatsCallback", "EpochAgreementCallback",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built",
    "start_timeline", "stop_timeline",
]
