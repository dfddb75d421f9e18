# gradflow/tensorflow/gradient_tape.py — DistributedGradientTape and the gradient
# reduction it shares with the Keras optimizer wrapper (`reduce_gradients`).
# Translates gradient lists only; the averaging itself happens in the core.
"""`DistributedGradientTape`: a `tf.GradientTape` whose `gradient()` returns
gradients averaged (by default) across ranks.

All dense gradients of one `gradient()` call cross to the core in ONE
`tf.numpy_function` call (one host round trip); every tensor is submitted
before any is waited on, so the core fuses them into few collectives.
`tf.IndexedSlices` gradients are made dense (`sparse_as_dense=True`) or their
values and indices are allgathered, as in Horovod.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from ..collectives import Adasum, Average, ReduceOp, Sum, reduce_op
from ..compression import Compression
from .ops import SparseRatio, _allreduce_indexed_slices, grouped_allreduce_raw


def reduce_gradients(grads: Sequence[Any], names: Sequence[str], op: ReduceOp = Average,
                     compression=Compression.none, sparse_ratio: SparseRatio = None,
                     sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0, process_set=None) -> List[Any]:
    """Reduce a flat list of gradients (None entries stay None) across the
    ranks of `process_set` (default: all).

    Dense gradients go in one grouped crossing; `names[i]` names gradient i on
    every rank, so it must be derived the same way everywhere (e.g. from the
    position in the variable list). `sparse_ratio` may be a callable read on
    every step (the Keras wrapper's mutable setting)."""
    op = reduce_op(op)
    if op not in (Sum, Average, Adasum):
        raise ValueError(f"gradflow: gradients can be reduced with Sum, Average or Adasum, not "
                         f"{op!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradflow: gradient_predivide_factor needs op=Average")
    # Average with predivide f: each rank scales by 1/f before the sum and the
    # core scales the sum by f/size afterwards (Horovod's split of the average).
    prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    out = list(grads)
    dense: List[int] = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                out[i] = tf.convert_to_tensor(g)
                dense.append(i)
            else:
                out[i] = _allreduce_indexed_slices(g, op, names[i], process_set)
        else:
            dense.append(i)
    reduced = grouped_allreduce_raw([out[i] for i in dense], [names[i] for i in dense], op,
                                    compression, prescale, postscale, sparse_ratio, process_set,
                                    count_step=True)
    for i, r in zip(dense, reduced):
        out[i] = r
    return out


class DistributedGradientTape:
    """Wraps a `tf.GradientTape`; `gradient()` returns gradients reduced
    across ranks. Use it around the tape or as the tape itself:

        with tf.GradientTape() as tape:
            loss = ...
        tape = gradflow.tensorflow.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    Gradient i of the sources is named `<name>.<i>` in the core; give two tapes
    that reduce different variable lists different `name`s when they use
    `sparse_ratio` (the core keeps a residual per name). Every other attribute
    is the wrapped tape's."""

    def __init__(self, tape: tf.GradientTape, compression=Compression.none, op: ReduceOp = Average,
                 sparse_ratio: Optional[float] = None, sparse_as_dense: bool = False,
                 gradient_predivide_factor: float = 1.0, name: str = "DistributedGradientTape",
                 process_set=None):
        if isinstance(tape, DistributedGradientTape):
            tape = tape._tape
        self._tape = tape
        self.compression = compression
        self.op = reduce_op(op)
        self.sparse_ratio = sparse_ratio
        self.sparse_as_dense = sparse_as_dense
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.name = name
        self.process_set = process_set  # reduce over its members (None: all ranks)

    def __enter__(self) -> "DistributedGradientTape":
        self._tape.__enter__()
        return self

    def __exit__(self, *exc) -> Any:
        return self._tape.__exit__(*exc)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._tape, attr)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The wrapped tape's gradient, reduced across ranks (same structure)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads)
        names = [f"{self.name}.{i}" for i in range(len(flat))]
        reduced = reduce_gradients(flat, names, self.op, self.compression,
                                   lambda: self.sparse_ratio, self.sparse_as_dense,
                                   self.gradient_predivide_factor, self.process_set)
        return tf.nest.pack_sequence_as(grads, reduced)
