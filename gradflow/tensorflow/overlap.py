# gradflow/tensorflow/overlap.py — gradient allreduce overlapped with backward inside
# tf.function: one "submit" node per gradient (starts the core's allreduce, returns
# a handle key) and one "wait" node per gradient (returns the reduced tensor).
# Translates tensors and handles only; the communication is the core's.
"""Overlapped gradient reduction for TensorFlow graphs (issue 16, target 4).

Why two nodes per gradient
--------------------------
A single `tf.numpy_function` that takes every gradient can only start once
the LAST gradient exists, i.e. after the whole backward. Inside `tf.function`
TensorFlow runs a node as soon as its inputs are ready, so a submit node whose
only data input is gradient i starts gradient i's allreduce in the core while
the rest of backward still runs; the core's background thread sends it while
TF computes the remaining gradients. The wait nodes come after every submit
and return the reduced tensors that the optimizer's update consumes.

Ordering (what makes it deterministic): the nodes are stateful numpy_functions,
and tf.function's automatic control dependencies chain stateful nodes without
resource inputs in program order (tensorflow/python/framework/
auto_control_deps.py). So the submits are created in REVERSE variable order
(the order backward produces gradients in a feed-forward model: last layer
first) and every wait after every submit; the same graph on every rank gives
the same order of submits everywhere. The core agrees on readiness by name
(the coordinator), so what goes on the wire does not depend on timing; names
and reduction parameters are the ones of the single-crossing path.

Buffers: the submit node's input array is a view of TF's tensor buffer; the
core's handle keeps that array (and the result array) alive until the wait,
and a held reference stops TF from forwarding the buffer to another op.

Eagerly (no graph) the gradients already exist when `reduce_gradients` is
called, so the single crossing (submit all, wait all) is used: eager mode is
sequential. `GRADFLOW_TF_OVERLAP=0` selects the single crossing in graphs too
(read when the step is traced; for A/B measurements).
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from .. import collectives as _c
from .. import monitor as _monitor
from ..collectives import ReduceOp, reduce_op
from ..compression import Compression, wire_code
from ..hyperparameter_tag import combine
from ..process_sets import ProcessSet
from ..settings_check import TF_OVERLAP_ENV, tf_overlap_enabled
from .ops import SparseRatio, _check_dtype, _check_not_xla, _resolve_ratio, grouped_allreduce_raw

OVERLAP_ENV = TF_OVERLAP_ENV

# handle key -> (core handle, static output shape); filled by submit nodes,
# emptied by wait nodes. Keys are unique per process (itertools.count is
# atomic under the GIL); the lock guards the dict against concurrent steps.
_pending: Dict[int, Tuple[object, Tuple[int, ...]]] = {}
_pending_lock = threading.Lock()
_keys = itertools.count(1)
_submits = 0  # overlapped submits run so far (tests and probes check the path was taken)


def overlap_enabled() -> bool:
    """Whether graph-mode gradient reduction overlaps with backward
    (GRADFLOW_TF_OVERLAP: 1/true/on (default) or 0/false/off). Read again
    at each trace, so a program may switch it between steps; init() has
    already rejected a bad value in the environment it started with
    (settings_check.py)."""
    return tf_overlap_enabled(os.environ)


def pending_count() -> int:
    """Submitted gradient allreduces not yet waited on (0 between steps)."""
    with _pending_lock:
        return len(_pending)


def overlapped_submits() -> int:
    """How many gradient allreduces this process started through submit nodes."""
    return _submits


def _submit_fn(name: str, op: ReduceOp, compression, prescale: float, postscale: float,
               sparse_ratio: SparseRatio, process_set: Optional[ProcessSet], count_step: bool,
               step_tag: str, round_tag: Any, round_cell: List[str]):
    """The callback of one submit node. The round's first submit
    (`count_step`) also begins `round_tag`'s round with the values given to
    its node after the gradient, and leaves the round's tag in `round_cell`
    for the submits after it (they run after it: see Ordering above)."""
    def submit(array: np.ndarray, *round_values: np.ndarray) -> np.ndarray:
        if count_step:
            _monitor.count_step()
            if round_tag is not None:
                round_cell[0] = round_tag.begin(*round_values)
        shape = tuple(array.shape)
        try:
            handle = _c.allreduce_async(array, op, name, prescale, postscale, compression,
                                        _resolve_ratio(sparse_ratio), process_set,
                                        step_tag=combine(step_tag, round_cell[0]))
        except BaseException:
            _drop_pending()
            raise
        key = next(_keys)
        global _submits
        with _pending_lock:
            _pending[key] = (handle, shape)
            _submits += 1
        return np.array(key, dtype=np.int64)
    return submit


def _drop_pending() -> None:
    """A step failed (a submit or a wait raised): TF will not run that step's
    other wait nodes, so drop its handles now, while the runtime that issued
    them is still the current one (a dropped handle is released to the core,
    which keeps its buffers until it is done: gradflow/_handles.py)."""
    with _pending_lock:
        stale = list(_pending.values())
        _pending.clear()
    del stale


def _wait(key: np.ndarray) -> np.ndarray:
    with _pending_lock:
        entry = _pending.pop(int(key), None)
    if entry is None:
        raise RuntimeError("gradflow: an overlapped gradient allreduce was dropped after an "
                           "earlier failure in this step")
    handle, shape = entry
    try:
        return np.reshape(handle.wait(), shape)  # the core returns 0-d arrays as shape [1]
    except BaseException:
        _drop_pending()
        raise


class PendingReduction:
    """Gradient allreduces started by `start_allreduce`; `finish()` returns
    the reduced tensors in the order given (graph: the wait nodes; eager or
    GRADFLOW_TF_OVERLAP=0: the single crossing, done at `finish()`)."""

    def __init__(self, finish_fn):
        self._finish_fn = finish_fn

    def finish(self) -> List[tf.Tensor]:
        return self._finish_fn()


def start_allreduce(tensors: Sequence[tf.Tensor], names: Sequence[str], op: ReduceOp,
                    compression: Any = Compression.none, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, sparse_ratio: SparseRatio = None,
                    process_set: Optional[ProcessSet] = None,
                    count_step: bool = False, step_tag: str = "",
                    round_tag: Any = None) -> PendingReduction:
    """Start the allreduce of dense gradients `tensors` (in variable order)
    with the arguments of `grouped_allreduce_raw` (`round_tag` needs
    `count_step`). While tracing (unless
    GRADFLOW_TF_OVERLAP=0): one submit node per tensor now, in reverse order,
    so each allreduce starts as soon as its gradient exists; `finish()` adds
    one wait node per tensor (build other collectives of the step between
    the two, so they do not delay the submits). Eagerly: the single crossing."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly() or not overlap_enabled() or len(tensors) < 2:
        return PendingReduction(lambda: grouped_allreduce_raw(
            tensors, names, op, compression, prescale_factor, postscale_factor, sparse_ratio,
            process_set, count_step, step_tag, round_tag))
    for t in tensors:
        _check_dtype(t, "allreduce")
    op = reduce_op(op)
    wire_code(compression)  # validate now, not inside the callback
    _check_not_xla(f"allreduce {names[0]!r}")
    last = len(tensors) - 1
    # No annotation here: AutoGraph converts this function when a traced step
    # calls it, and cannot make an annotated name nonlocal for finish() (it
    # warned on every trace). One submit key (int64 tensor) per tensor.
    keys = [None] * len(tensors)
    round_inputs = list(round_tag.inputs()) if round_tag is not None and count_step else []
    round_cell = [""]  # this site's current round tag, written by its first submit
    for i in range(last, -1, -1):  # backward order: the last variable's gradient comes first
        first = i == last
        fn = _submit_fn(names[i], op, compression, prescale_factor, postscale_factor,
                        sparse_ratio, process_set, count_step and first, step_tag,
                        round_tag if round_inputs else None, round_cell)
        keys[i] = tf.numpy_function(fn, [tensors[i]] + (round_inputs if first else []),
                                    tf.int64, stateful=True, name="gradflow_submit")

    def finish() -> List[tf.Tensor]:
        outs = []
        for i in range(last, -1, -1):  # waits in submit order: the first submitted is done first
            out = tf.numpy_function(_wait, [keys[i]], tensors[i].dtype, stateful=True,
                                    name="gradflow_wait")
            out.set_shape(tensors[i].shape)
            outs.append(out)
        return outs[::-1]

    return PendingReduction(finish)
