# gradflow/tensorflow/gradient_tape.py — DistributedGradientTape,
# PartialDistributedGradientTape and the gradient reduction they share with the
# Keras optimizer wrapper (`reduce_gradients`).
# Translates gradient lists only; the averaging itself happens in the core.
"""`DistributedGradientTape`: a `tf.GradientTape` whose `gradient()` returns
gradients averaged (by default) across ranks.

Inside `tf.function` each dense gradient's allreduce is started by its own
submit node as soon as that gradient exists, and waited for at the end
(overlap with backward, see overlap.py); eagerly (or with
GRADFLOW_TF_OVERLAP=0) all dense gradients of one `gradient()` call cross to
the core in ONE call. Either way every tensor is submitted before any is
waited on, so the core fuses those that are ready together.
`tf.IndexedSlices` gradients are made dense (`sparse_as_dense=True`) or their
values and indices are allgathered, as in Horovod.
Over a process set of one member nothing crosses to the core: the gradients
are the reduced gradients (one_rank.py).
"""
from __future__ import annotations

import weakref
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.eager import record as _tape_record

from .. import _runtime
from ..collectives import Adasum, Average, Max, ReduceOp, Sum, check_adasum_options, reduce_op
from ..compression import Compression, wire_code
from ..process_sets import ProcessSet, global_process_set, member_id, process_set_size
from ..missing_gradients import zeros_where_others_have_gradients
from ..one_rank import check_sparse_ratio, gradients_are_local
from .one_rank import local_gradients
from .ops import SparseRatio, _allreduce_indexed_slices, _as_tf_variable, grouped_allreduce_raw
from .overlap import start_allreduce


def reduce_gradients(grads: Sequence[Any], names: Sequence[str], op: ReduceOp = Average,
                     compression: Any = Compression.none, sparse_ratio: SparseRatio = None,
                     sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0,
                     process_set: Optional[ProcessSet] = None, round_tag: Any = None) -> List[Any]:
    """Reduce a flat list of gradients (None entries stay None) across the
    ranks of `process_set` (default: all).

    Dense gradients go in one grouped crossing; `names[i]` names gradient i on
    every rank, so it must be derived the same way everywhere (e.g. from the
    position in the variable list). `sparse_ratio` may be a callable read on
    every step (the Keras wrapper's mutable setting). Over a one-member set
    the gradients come back as they are, nothing crossing to the core
    (gradflow/one_rank.py; decided when traced, except in elastic mode).
    `round_tag`: a per-round tag of the dense allreduces (the Keras
    hyperparameter check; see ops.grouped_allreduce_raw)."""
    op = reduce_op(op)
    if op not in (Sum, Average, Adasum):
        raise ValueError(f"gradflow: gradients can be reduced with Sum, Average or Adasum, not "
                         f"{op!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradflow: gradient_predivide_factor needs op=Average")
    if gradients_are_local(process_set, "gradient reduction", traced=not tf.executing_eagerly()):
        # One member: the reduction is the identity (gradflow/one_rank.py).
        return local_gradients(grads, names, compression, sparse_ratio, sparse_as_dense)
    # Average with predivide f: each rank scales by 1/f before the sum and the
    # core scales the sum by f/size afterwards (Horovod's split of the average).
    prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    out = list(grads)
    dense: List[int] = []
    sliced: List[int] = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
            sliced.append(i)
        else:
            out[i] = tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
            dense.append(i)
    # Dense allreduces start first (in a graph: as each gradient appears, see
    # overlap.py); the allgathers of IndexedSlices are built after them so they
    # do not hold the submits back, and the dense results are waited for last.
    dense_names = [names[i] for i in dense]
    tag, rtag = step_tag(grads, dense, sliced), (round_tag if dense else None)

    def start(xs):
        return start_allreduce(xs, dense_names, op, compression, prescale, postscale, sparse_ratio,
                               process_set, count_step=True, step_tag=tag, round_tag=rtag)

    if dense and op in (Sum, Average) and _tape_record.could_possibly_record():
        # An outer tape is recording (a gradient penalty, meta-learning):
        # the reduced gradients must be differentiable, as Horovod's are.
        # Only then, since the wrapper makes every gradient wait for all of
        # them (no overlap with backward inside a tf.function).
        pending = _DifferentiableReduction(start, [out[i] for i in dense], dense_names, op,
                                           prescale, postscale, process_set)
    else:
        pending = start([out[i] for i in dense])
    for i in sliced:
        out[i] = _allreduce_indexed_slices(grads[i], op, names[i], process_set)
    reduced = pending.finish()
    for i, r in zip(dense, reduced):
        out[i] = r
    return out


class _DifferentiableReduction:
    """The dense gradient reduction as a `tf.custom_gradient` op: its
    gradient is the upstream gradient allreduced with the same op and
    scaling (the adjoint of a sum over ranks; ops.allreduce's rule).
    `finish()` gives the reduced list, like start_allreduce's handle."""

    def __init__(self, start, xs, names, op, prescale, postscale, process_set):
        @tf.custom_gradient
        def _reduce(*inputs):
            ys = start(list(inputs)).finish()

            def grad(*dys):
                return grouped_allreduce_raw(
                    [tf.convert_to_tensor(d) for d in dys], [f"{n}.grad" for n in names], op,
                    prescale_factor=prescale, postscale_factor=postscale,
                    process_set=process_set, grouped=True)

            return ys, grad

        self._reduced = list(_reduce(*xs))

    def finish(self):
        return self._reduced


def step_tag(grads: Sequence[Any], dense: Sequence[int], sliced: Sequence[int]) -> str:
    """The step tag of one gradient reduction (native Note [Step tags]):
    how many gradients it reduces and a hash of which, dense or sliced.
    Equal on every rank that reduces the same gradients; where a traced step
    left a gradient None on some ranks only, the core aborts the job at once
    with both tags instead of every rank waiting for GRADFLOW_TIMEOUT."""
    kinds = ["-"] * len(grads)
    for i in dense:
        kinds[i] = "d"
    for i in sliced:
        kinds[i] = "s"
    present = len(dense) + len(sliced)
    return f"{present} of {len(grads)} gradients #{zlib.crc32(''.join(kinds).encode()):08x}"


def _source_key(source: Any) -> Any:
    """A hashable identity for a tape source: tf.Variable.ref(), the wrapped
    tf.Variable's ref for a Keras 3 variable (so the Keras variable and its
    `.value` count as one source), else the object's id."""
    variable = _as_tf_variable(source)
    return id(source) if variable is None else variable.ref()


# Note [Default tape names]
# --------------------------
# A tape's gradient i is named `<name>.<i>` in the core, and the core keeps
# a CSC residual per name. Every tape used to default to the one name
# "DistributedGradientTape", so two default-named tapes reducing different
# variables (a GAN's generator and discriminator, two models trained side by
# side) shared `<name>.0`, ...: with sparse_ratio, what one tape did not send
# was added to the other's gradient (found by the 2026-11-28 combination
# audit: 2 ranks, one tape's gradients came out 39x their true sum), and
# without it their names' cached shapes alternated each step. A default-named
# tape is now named after the list of variables it reduces: the first list
# seen keeps "DistributedGradientTape", the next one "DistributedGradientTape1",
# ... counted per process set, in the order the lists first reach gradient().
# Every rank runs the same training code, so every rank counts alike (as the
# Keras wrapper's per-class count); the count starts again at each runtime
# generation (an elastic reset), so a newcomer and the survivors agree. A
# name given by the user is used as it is.
DEFAULT_NAME = "DistributedGradientTape"
# (generation, process set, list key) -> (index, the variables' weak references)
_source_lists: Dict[Tuple[int, int, Tuple[Any, ...]], Tuple[int, List[Any]]] = {}
_lists_seen: Dict[Tuple[int, int], int] = {}


def _list_key(source: Any) -> Tuple[Any, Any]:
    """(key part, weak reference or None) of one source: a variable counts
    by identity; a watched tensor (a new one each step, its shape perhaps
    changing with the batch) only by being a tensor, so its tape keeps one
    name."""
    variable = _as_tf_variable(source)
    if variable is None:
        return "tensor", None
    try:
        return id(variable), weakref.ref(variable)
    except TypeError:  # not weakly referable: held (the list's variables live as long)
        return id(variable), (lambda v=variable: v)


def default_name(process_set: Optional[ProcessSet], sources: Sequence[Any]) -> str:
    """The core name of a default-named tape reducing `sources` (Note
    [Default tape names]). A list matches an earlier one only if it holds
    the very same live variables: an id freed and reused by a new variable
    (which happens on some ranks and not others) starts a new list."""
    ps = member_id(process_set, "DistributedGradientTape")
    gen = _runtime.generation()
    parts = [_list_key(s) for s in sources]
    key = (gen, ps, tuple(k for k, _ in parts))
    known = _source_lists.get(key)
    if known is not None and all(ref is None or ref() is _as_tf_variable(s)
                                 for ref, s in zip(known[1], sources)):
        index = known[0]
    else:
        if any(k[0] != gen for k in _lists_seen):  # a new runtime: count afresh
            _source_lists.clear()
            _lists_seen.clear()
        index = _lists_seen.get((gen, ps), 0)
        _lists_seen[(gen, ps)] = index + 1
        _source_lists[key] = (index, [ref for _, ref in parts])
    return DEFAULT_NAME if index == 0 else f"{DEFAULT_NAME}{index}"


def _check_groups(num_groups: int, groups: Any, what: str) -> None:
    if num_groups or groups is not None:
        raise ValueError(f"gradflow: {what}(num_groups=, groups=) is not supported (gradflow fuses "
                         "gradients by its own bucket size, GRADFLOW_FUSION_THRESHOLD); leave them "
                         "at 0 / None")


class DistributedGradientTape:
    """Wraps a `tf.GradientTape`; `gradient()` returns gradients reduced
    across ranks. Use it around the tape or as the tape itself:

        with tf.GradientTape() as tape:
            loss = ...
        tape = gradflow.tensorflow.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    Horovod 0.28's signature, positional order included. `device_dense` /
    `device_sparse` are accepted and ignored (gradflow reduces on the host);
    `num_groups` / `groups` raise ValueError (gradflow fuses by its own bucket
    size); `process_set` (default: all ranks): reduce over its members (this
    rank must be one). Sources registered with `register_local_source` are
    not reduced; with `scale_local_gradients` their gradients are divided by
    the number of members (as Horovod).
    gradflow only (keywords): `sparse_ratio` (coarse-grained sparse
    communication) and `name`: reduced gradient i is named `<name>.<i>` in
    the core (the core keeps a CSC residual per name). Left at its default,
    each list of variables a tape reduces gets its own name
    ("DistributedGradientTape", then "DistributedGradientTape1", ... in the
    order the lists first reach gradient(), Note [Default tape names]);
    a name you give is used as is, so give tapes that reduce different
    variable lists different names.
    Every other attribute is the wrapped tape's."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: Any = Compression.none, sparse_as_dense: bool = False,
                 op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, groups: Any = None,
                 process_set: Optional[ProcessSet] = global_process_set,
                 scale_local_gradients: bool = True, *, sparse_ratio: Optional[float] = None,
                 name: str = DEFAULT_NAME):
        del device_dense, device_sparse  # documented no-ops on CPU
        # GRADFLOW_SPARSE_RATIO's limits (settings_check.py), before anything
        # else reads it as a number.
        check_sparse_ratio(sparse_ratio, "DistributedGradientTape")
        _check_groups(num_groups, groups, "DistributedGradientTape")
        # Registered, and this rank a member: a non-member's tape could never reduce.
        member_id(process_set, "DistributedGradientTape")
        check_adasum_options(op, wire_code(compression), sparse_ratio, "DistributedGradientTape")
        if isinstance(gradtape, DistributedGradientTape):
            gradtape = gradtape._tape
        self._tape = gradtape
        self.compression = compression
        self.op = reduce_op(op)
        self.sparse_ratio = sparse_ratio
        self.sparse_as_dense = sparse_as_dense
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        if self.gradient_predivide_factor != 1.0 and self.op != Average:
            raise ValueError("gradflow: gradient_predivide_factor needs op=Average")
        self.process_set = process_set  # reduce over its members (None: all ranks)
        self.scale_local_gradients = bool(scale_local_gradients)
        self.name = name
        self._default_name = name == DEFAULT_NAME  # Note [Default tape names]
        self._local_sources: set = set()

    def __enter__(self) -> "DistributedGradientTape":
        self._tape.__enter__()
        return self

    def __exit__(self, *exc) -> Any:
        return self._tape.__exit__(*exc)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._tape, attr)

    def register_local_source(self, source: Any) -> None:
        """Mark `source` (a variable) as local to this rank: its gradient is
        not reduced (only divided by size with `scale_local_gradients`)."""
        self._local_sources.add(_source_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 use_generic_names: bool = False,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE
                 ) -> Any:
        """The wrapped tape's gradient, reduced across ranks (same structure).
        `use_generic_names` changes nothing: gradflow's names are always
        positional (`<name>.<i>`), identical on every rank."""
        del use_generic_names
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        name = default_name(self.process_set, flat_sources) if self._default_name else self.name
        local = [_source_key(s) in self._local_sources for s in flat_sources]
        shared = [i for i, is_local in enumerate(local) if not is_local]
        if tf.executing_eagerly() and shared:
            flat = self._zeros_where_others_have_gradients(flat, flat_sources, shared, name)
        out = list(flat)
        # Keras float8's scales and amax histories: their "gradient" is the
        # new value, the Max over the ranks (as the Keras wrapper, Note
        # [Overwritten variables] in gradflow/keras/overwritten.py; before
        # 2026-11-29 averaged: an amax of 3.87 where one rank's was 5.42).
        over = [i for i in shared if flat[i] is not None and
                getattr(flat_sources[i], "overwrite_with_gradient", False)]
        if over and not gradients_are_local(self.process_set, "gradient reduction",
                                            traced=not tf.executing_eagerly()):
            maxed = grouped_allreduce_raw([flat[i] for i in over],
                                          [f"{name}.max.{i}" for i in over], Max,
                                          process_set=self.process_set)
            for i, m in zip(over, maxed):
                out[i] = m
        shared = [i for i in shared if i not in over]
        reduced = reduce_gradients([flat[i] for i in shared],
                                   [f"{name}.{k}" for k in range(len(shared))], self.op,
                                   self.compression, lambda: self.sparse_ratio,
                                   self.sparse_as_dense, self.gradient_predivide_factor,
                                   self.process_set)
        for i, r in zip(shared, reduced):
            out[i] = r
        if self.scale_local_gradients and len(shared) < len(flat):
            for i, is_local in enumerate(local):
                if is_local and out[i] is not None:
                    out[i] = _divide(out[i], process_set_size(self.process_set, "gradient"))
        return tf.nest.pack_sequence_as(grads, out)

    def _zeros_where_others_have_gradients(self, flat: List[Any], sources: List[Any],
                                           shared: List[int], name: str) -> List[Any]:
        """Note [None on some ranks] (gradflow/missing_gradients.py), eager
        calls only; as the torch optimizer reduces zeros for a parameter
        without a gradient."""
        if gradients_are_local(self.process_set, "gradient reduction", traced=False):
            return flat
        return zeros_where_others_have_gradients(
            flat, shared, lambda i: tf.zeros(sources[i].shape, sources[i].dtype),
            f"{name}.has_gradient", self.process_set)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False
                                       ) -> Tuple[List[Tuple[Any, Any]], List[Tuple[Any, Any]]]:
        """`gradient()` split as Horovod: ([(local source, grad)], [(shared
        source, grad)]), each in the order of `sources` (a flat list)."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if _source_key(s) in self._local_sources else shared).append((s, g))
        return local, shared


def _divide(grad: Any, n: int) -> Any:
    if n == 1:
        return grad  # x / 1 == x: no elementwise pass on one rank
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: ReduceOp = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None,
                                   process_set: Optional[ProcessSet] = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> DistributedGradientTape:
    """A DistributedGradientTape that does not reduce the gradients of the
    trainable weights of `local_layers` (a Keras layer or a list of them), as
    Horovod 0.28: those stay local to each rank (divided by size with
    `scale_local_gradients`). Other arguments as DistributedGradientTape."""
    import keras  # only here: gradflow.tensorflow does not otherwise need Keras

    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("gradflow: all local_layers must be keras.layers.Layer objects")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
