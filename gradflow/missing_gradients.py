# gradflow/missing_gradients.py — Note [None on some ranks], framework-free:
# the one small Sum that tells every rank which gradients some rank has, so
# the ranks without one reduce zeros instead of skipping the name. Used by
# TensorFlow's eager DistributedGradientTape and the Keras
# DistributedOptimizer run eagerly; the callers make the zeros.
"""Note [None on some ranks]: run eagerly, Python control flow can leave a
gradient None on some ranks and not others. The ranks with it would wait in
a reduction the others never join (a stall), or pair it with another
step's gradient of the same name (silently wrong). One Sum of "this rank
has gradient i" (4 bytes per gradient) lets every rank put zeros where it
has none and another rank has one; a gradient None on every rank stays
None. In a traced step which gradients are None is fixed when it is traced,
so callers only do this eagerly; there a difference between the ranks ends
the job within seconds through the reduction's step tag (native Note [Step
tags]). Cost: one small allreduce per eager step on more than one rank;
waited for before the gradients it cost ~0.4 ms per Keras step, submitted
with them (the Keras torch path) nothing measurable (docs/performance.md,
"Keras run eagerly: the presence Sum")."""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ._handles import Handle
from .collectives import Sum, allreduce_async


def start_presence_sum(grads: Sequence[Any], indices: Sequence[int], name: str,
                       process_set: Optional[Any]) -> Handle:
    """Start the Sum over `process_set` of "this rank has grads[i]" for i in
    `indices`; its wait() gives, per index, how many members have it. A
    collective named `name`: every member calls it."""
    mine = np.array([grads[i] is not None for i in indices], np.int32)
    return allreduce_async(mine, Sum, name, process_set=process_set)


def fill_zeros(grads: Sequence[Any], indices: Sequence[int], counts: np.ndarray,
               zeros_for: Callable[[int], Any]) -> List[Any]:
    """A copy of `grads` with zeros_for(i) where grads[i] is None here and
    counts (start_presence_sum's result) says another member has it."""
    out = list(grads)
    for k, i in enumerate(indices):
        if out[i] is None and counts[k] > 0:
            out[i] = zeros_for(i)
    return out


def zeros_where_others_have_gradients(grads: Sequence[Any], indices: Sequence[int],
                                      zeros_for: Callable[[int], Any], name: str,
                                      process_set: Optional[Any]) -> List[Any]:
    """A copy of `grads` where grads[i] (i in `indices`, the reduced ones)
    is None on this rank but not on some other member of `process_set`
    becomes `zeros_for(i)`. A collective named `name`: every member calls it."""
    counts = start_presence_sum(grads, indices, name, process_set).wait()
    return fill_zeros(grads, indices, counts, zeros_for)
