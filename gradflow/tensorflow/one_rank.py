# gradflow/tensorflow/one_rank.py — the one-rank gradient "reduction" of
# reduce_gradients (DistributedGradientTape and the Keras DistributedOptimizer
# on the TensorFlow backend): the local gradients, with the same argument
# checks as on N ranks and nothing crossing to the core (gradflow/one_rank.py).
"""Where one rank's time went before (docs/performance.md, "Keras: one rank
costs nothing"): every step crossed to the core through `tf.numpy_function`
host callbacks (one per gradient with overlap), the core copied the 25 M
gradients into fresh result arrays that TF adopted (100 MB of new memory
written per step), and each gradient made a background-loop round trip. Over
one rank all of that returns the input, so here the gradient tensors are
handed back as they are: the traced step is the plain TensorFlow step.

Kept from the N-rank path so a script that runs on one rank runs on N:
the dtype check of every gradient, the XLA refusal while tracing (gradflow's
reduction is a host callback on N ranks), the compression and sparse_ratio
checks, `sparse_as_dense` (an IndexedSlices gradient becomes dense, as the
user asked; otherwise it is returned as is — the allgather of one member's
values and indices, divided by 1), and the step count of
`gradflowrun --monitor`.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np
import tensorflow as tf

from .. import monitor as _monitor
from ..compression import wire_code
from ..one_rank import check_sparse_ratio
from .ops import SparseRatio, _check_dtype, _check_not_xla, _resolve_ratio


def local_gradients(grads: Sequence[Any], names: Sequence[str], compression,
                    sparse_ratio: SparseRatio, sparse_as_dense: bool) -> List[Any]:
    """`grads` reduced over a one-member set: the same tensors (None stays
    None; IndexedSlices made dense only with `sparse_as_dense`), after the
    checks the N-rank path makes. `sparse_ratio` may be a callable; it is
    read now (eagerly: every step; traced: once, later changes are checked
    where they are made)."""
    wire_code(compression)
    check_sparse_ratio(_resolve_ratio(sparse_ratio), "gradient reduction")
    traced = not tf.executing_eagerly()
    out: List[Any] = []
    for g, name in zip(grads, names):
        if g is None:
            out.append(None)
            continue
        if isinstance(g, tf.IndexedSlices):
            _check_dtype(g.values, "allgather")
            out.append(tf.convert_to_tensor(g) if sparse_as_dense else g)
            continue
        _check_dtype(g, "allreduce")
        out.append(g)
    if traced and out:
        _check_not_xla(f"allreduce {names[0]!r}")
    if not traced:
        _monitor.count_step()
    elif _monitor.running():
        # A stateful node runs on every step of the traced function even
        # though nothing consumes it; only built when monitoring.
        tf.numpy_function(_count_step, [], tf.int64, stateful=True, name="gradflow_count_step")
    return out


def _count_step() -> np.ndarray:
    _monitor.count_step()
    return np.array(0, dtype=np.int64)
