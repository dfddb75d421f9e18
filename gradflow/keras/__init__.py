# gradflow/keras/__init__.py — public Keras 3 API: re-exports only.
# Shares the one gradflow runtime with gradflow.tensorflow and gradflow.torch.
"""gradflow for Keras 3: (Partial)DistributedOptimizer, callbacks, Horovod's
Keras-level value collectives and load_model. See docs/tensorflow.md."""
from .._runtime import (GradflowError, cross_rank, cross_size, init, is_initialized, local_rank,
                        local_size, rank, shutdown, size)
from ..collectives import Adasum, Average, Sum
from ..compression import Compression
from .callbacks import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,
                        LearningRateScheduleCallback, LearningRateWarmupCallback,
                        MetricAverageCallback, SparseWarmupCallback, broadcast_keras_variables)
from .functions import (allgather, allreduce, broadcast, broadcast_global_variables, load_model,
                        reducescatter)
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, is_distributed

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "GradflowError", "Average", "Sum", "Compression", "DistributedOptimizer", "is_distributed",
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint", "SparseWarmupCallback",
    "broadcast_keras_variables", "cross_rank", "cross_size", "Adasum",
    "PartialDistributedOptimizer", "allreduce", "allgather", "broadcast", "reducescatter",
    "broadcast_global_variables", "load_model", "callbacks",
]
