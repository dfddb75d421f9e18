# gradflow/keras/__init__.py — public Keras 3 API: re-exports only.
# Shares the one gradflow runtime with gradflow.tensorflow and gradflow.torch.
"""gradflow for Keras 3: DistributedOptimizer, callbacks and SyncBatchNormalization.
See docs/tensorflow.md."""
from .._runtime import (GradflowError, init, is_initialized, local_rank, local_size, rank,
                        shutdown, size)
from ..collectives import Average, Sum
from ..compression import Compression
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,
                        LearningRateScheduleCallback, LearningRateWarmupCallback,
                        MetricAverageCallback, SparseWarmupCallback, broadcast_keras_variables)
from .optimizer import DistributedOptimizer, is_distributed
from .sync_batch_norm import SyncBatchNormalization
from .stats_callback import TensorBoardStatsCallback

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "GradflowError", "Average", "Sum", "Compression", "DistributedOptimizer", "is_distributed",
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint", "SparseWarmupCallback",
    "broadcast_keras_variables", "SyncBatchNormalization", "TensorBoardStatsCallback",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]
