# gradflow/one_rank.py — the one-rank decision of the gradient wrappers that
# hand gradient lists to the core (TensorFlow's DistributedGradientTape, the
# Keras DistributedOptimizer on either backend). Framework-free; the torch
# DistributedOptimizer has its own equivalent (Note [One rank],
# gradflow/torch/optimizer.py) tied to its pools.
"""Over a process set of one member, averaging or summing gradients is the
identity: the reduced gradient is the local gradient, bit for bit, whatever
the wire format (fp16/bf16), CSC ratio, Adasum or predivide factor (the
factors cancel), as in Horovod and DDP. A wrapper that asks
`gradients_are_local` and gets True hands its gradients back without
crossing to the core: no host callback, no copy, no background-loop round
trip, no 16-bit rounding, no CSC residual (with no link there is nothing to
save, and error feedback would only delay gradient mass).

A traced TensorFlow graph keeps the decision made when it was traced. That
is only safe while the set's size cannot change under it: process sets are
fixed once registered, but an elastic job re-forms the world under an
already compiled step (docs/elastic.md, Keras: the train function is kept
across resets). So a traced graph in elastic mode always goes through the
core; eager calls decide on every call.
"""
from __future__ import annotations

from typing import Any, Optional

from .elastic import worker as _elastic_worker
from .process_sets import process_set_size
from .settings_check import native_sparse_ratio


def gradients_are_local(process_set: Any, what: str, traced: bool) -> bool:
    """Whether reducing gradients over `process_set` (None: all ranks) is the
    identity for a wrapper: the set has one member, and (for a decision baked
    into a traced graph, `traced=True`) the job is not elastic. Raises, like
    every reduction, when gradflow is not initialized or the set is not
    registered."""
    if process_set_size(process_set, what) != 1:
        return False
    return not (traced and _elastic_worker.current() is not None)


def check_sparse_ratio(sparse_ratio: Optional[float], what: str) -> None:
    """GradflowValueError (a ValueError) unless `sparse_ratio` is None
    (GRADFLOW_SPARSE_RATIO applies) or a number GRADFLOW_SPARSE_RATIO would
    accept (settings_check.py): refused where the wrapper is built, and where
    no submit happens (one rank)."""
    native_sparse_ratio(sparse_ratio, what)
