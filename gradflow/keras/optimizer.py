# gradflow/keras/optimizer.py — (Partial)DistributedOptimizer for Keras 3: a dynamic
# subclass of the user's optimizer class that reduces gradients across ranks
# before the parent's update. Translates gradient lists only (TF backend:
# gradflow.tensorflow; torch backend: numpy, eager_reduce.py; float8 state:
# overwritten.py); no communication logic here.
"""`DistributedOptimizer(optimizer, ...)`: wrap any `keras.optimizers.Optimizer`
so that `model.compile(optimizer=...)` + `model.fit` averages gradients across
ranks.

The wrapper is a subclass of the user's optimizer class built from its config
(`cls.from_config(optimizer.get_config())`, as Horovod does): use the returned
object, not the original. Its `apply()` reduces the gradient list, then calls
the parent's `apply()`. With the TensorFlow backend the reduction is one
`tf.numpy_function` per step (inside `model.fit`'s tf.function), so the model
must not be compiled with XLA: the wrapper raises a clear error when traced
under `jit_compile=True` (Keras resolves `"auto"` to False on CPU-only hosts;
on GPU hosts pass `jit_compile=False` to `model.compile`).

`backward_passes_per_step=k > 1` uses Keras's own gradient accumulation
(`gradient_accumulation_steps=k`) with Horovod's meaning: gradients are
aggregated locally over k batches, reduced across ranks once every k batches,
and the update uses their SUM (Horovod's default,
`average_aggregated_gradients=False`) or their mean over the k batches
(`average_aggregated_gradients=True`, which is what Keras's accumulation alone
would do).

Over a process set of one member (e.g. one rank) the gradients are not
reduced at all: averaging is the identity, so the update is the plain
optimizer's, bit for bit, in every mode (wire format, CSC, Adasum, predivide,
accumulation), and nothing crosses to the core (gradflow/one_rank.py;
decided when the step is traced, except in elastic mode where the world may
re-form under a compiled step). The argument checks stay.

Ranks whose optimizers use different hyperparameters (a learning rate
lowered by ReduceLROnPlateau on a rank-local metric) fail the job with
GradflowError on every rank within 16 steps (hyperparameter_check.py).

`optimizer.sparse_ratio` is read on every step (so `SparseWarmupCallback` can
change it between epochs without retracing): None follows
GRADFLOW_SPARSE_RATIO, 1.0 is dense, r < 1 sends the top r fraction of chunks.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

import keras

from .. import _native
from .. import collectives as _c
from ..collectives import Average, ReduceOp, reduce_op
from ..compression import Compression, wire_code
from ..missing_gradients import zeros_where_others_have_gradients
from ..one_rank import check_sparse_ratio, gradients_are_local
from ..process_sets import ProcessSet, global_process_set, member_id, process_set_size
from . import loss_scale as _loss_scale
from . import saved_accumulation as _saved_accumulation
from .eager_reduce import _divided, _eager, _nan_if_any_rank_not_finite, _reduce_eager_numpy
from .hyperparameter_check import HyperparameterCheck
from .overwritten import max_overwritten


class _DistributedMixin:
    """Methods placed in front of the user's optimizer class (see DistributedOptimizer)."""

    _gradflow_wrapped = True

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """`type(opt).from_config(opt.get_config())` (a copy, as Keras's
        clone utilities make): the user's optimizer from `config`, wrapped
        again with the same gradflow settings. It used to build an object
        that claimed to be distributed and failed at its first step."""
        config = dict(config)
        passes = cls._gradflow_passes
        if passes > 1:  # DistributedOptimizer put it there (a user's own stays)
            config.pop("gradient_accumulation_steps", None)
        base = cls._gradflow_base
        inner = base.from_config(config, custom_objects=custom_objects) \
            if custom_objects is not None else base.from_config(config)
        return DistributedOptimizer(inner, backward_passes_per_step=passes,
                                    **cls._gradflow_settings)

    @property
    def lr(self) -> Any:
        """Keras 2's `learning_rate` alias, gone in Keras 3 but used by Horovod's
        elastic Keras example (`tf.keras.backend.set_value(opt.lr, x)` on reset).
        TF backend: the step's `tf.Variable` (set_value/assign/float work);
        a schedule as is, as Keras 2."""
        if isinstance(self, keras.optimizers.MultiOptimizer):
            return self.learning_rate  # Keras's AttributeError: a rate per optimizer
        rate = self._learning_rate
        if isinstance(rate, keras.Variable) and keras.backend.backend() == "tensorflow":
            return rate.value  # keras.Variable -> its tf.Variable (set_value needs one)
        return rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    @property
    def sparse_ratio(self) -> Optional[float]:
        """CSC ratio read on every step (None: GRADFLOW_SPARSE_RATIO, 1.0:
        dense). Checked when set: the one-rank path never submits, so the
        core would never see a bad value."""
        return self._gradflow_sparse_ratio

    @sparse_ratio.setter
    def sparse_ratio(self, value: Optional[float]) -> None:
        check_sparse_ratio(value, "DistributedOptimizer")
        self._gradflow_sparse_ratio = value

    def _gradflow_setup(self, name: str, compression, op: ReduceOp, sparse_ratio: Optional[float],
                        backward_passes_per_step: int, sparse_as_dense: bool,
                        gradient_predivide_factor: float,
                        average_aggregated_gradients: bool, process_set: Any = None,
                        scale_local_gradients: bool = True) -> None:
        self.gradflow_name = name
        self.process_set = process_set  # gradients are reduced over its members
        self.compression = compression
        self.op = reduce_op(op)
        self.sparse_ratio = sparse_ratio
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self.scale_local_gradients = bool(scale_local_gradients)
        self._gradflow_local_ids: set = set()
        # Inside a LossScaleOptimizer's apply(), which reduced already when
        # backward_passes_per_step is 1 (Note [LossScaleOptimizer], loss_scale.py).
        self._gradflow_in_loss_scale = False
        # Ranks whose learning rates (...) differ fail the job (hyperparameter_check.py).
        self._gradflow_hyper = HyperparameterCheck(self)

    def register_local_var(self, var: Any) -> None:
        """Mark `var` as local to this rank (Horovod 0.28): its gradient is not
        reduced across ranks (only divided by size with scale_local_gradients)."""
        if self.backward_passes_per_step > 1:
            raise ValueError("gradflow: local variables are not supported together with "
                             "backward_passes_per_step > 1")
        self._gradflow_local_ids.add(id(var))

    def apply(self, grads, trainable_variables=None):
        """Reduce `grads` across ranks (every step when backward_passes_per_step
        is 1), then the wrapped optimizer's apply()."""
        grads = list(grads)
        if self._gradflow_in_loss_scale:  # reduced by _gradflow_before_loss_scale already
            return super().apply(grads, trainable_variables)
        held = max_overwritten(self, grads, trainable_variables)  # Note [Overwritten variables]
        if isinstance(self, keras.optimizers.LossScaleOptimizer):
            # Horovod's order, DistributedOptimizer(LossScaleOptimizer(opt)):
            # scaled gradients (Note [Residuals in unscaled units], loss_scale.py).
            grads = _loss_scale.reduce_unscaled(
                self, self, grads, trainable_variables,
                lambda g: self._gradflow_reduce_in_apply(g, trainable_variables))
        else:
            grads = self._gradflow_reduce_in_apply(grads, trainable_variables)
        for i, g in held.items():
            grads[i] = g
        return super().apply(grads, trainable_variables)

    def _gradflow_reduce_in_apply(self, grads: List[Any], trainable_variables=None) -> List[Any]:
        if (self.backward_passes_per_step == 1 and not self._gradflow_local_ids and
                keras.backend.backend() == "torch"):
            # The common eager step: the presence Sum travels with the
            # gradients instead of before them (_reduce_eager_numpy).
            return _reduce_eager_numpy(grads, self._gradflow_names(len(grads), trainable_variables),
                                       self, self._gradflow_presence(grads, trainable_variables))
        grads = self._gradflow_zeros_where_others_have_gradients(grads, trainable_variables)
        if self.backward_passes_per_step == 1:
            grads = self._gradflow_reduce_step(grads, trainable_variables)
        return grads

    def _gradflow_zeros_where_others_have_gradients(self, grads: List[Any],
                                                   trainable_variables=None) -> List[Any]:
        presence = self._gradflow_presence(grads, trainable_variables)
        if presence is None:
            return grads
        indices, zeros_for = presence
        return zeros_where_others_have_gradients(grads, indices, zeros_for,
                                                 f"{self.gradflow_name}.has_gradient",
                                                 self.process_set)

    def _gradflow_presence(self, grads: List[Any], trainable_variables=None) -> Optional[Any]:
        """Note [None on some ranks] (gradflow/missing_gradients.py): run
        eagerly (the torch backend; `run_eagerly=True` on TensorFlow),
        Python control flow in `call()` can leave a gradient None on some
        ranks only. Keras drops None gradients before its update, so those
        ranks would skip names the others reduce (with
        backward_passes_per_step > 1: lists of different lengths). Zeros
        where another rank has a gradient; None on every rank stays None
        (Keras skips that variable, as without gradflow). Not in a traced
        step, and once per step under a LossScaleOptimizer (its apply()
        ran this already). Returns (indices of the reduced gradients, a
        function giving zeros for index i), or None where no Sum is due."""
        if self._gradflow_in_loss_scale or not _eager() or not grads:
            return None
        if gradients_are_local(self.process_set, "DistributedOptimizer", traced=False):
            return None
        variables = list(self._trainable_variables if trainable_variables is None
                         else trainable_variables)
        if len(variables) != len(grads):
            return None  # Keras's apply() raises its own error for that
        shared = [i for i, v in enumerate(variables) if id(v) not in self._gradflow_local_ids]
        return shared, lambda i: keras.ops.zeros(variables[i].shape, variables[i].dtype)

    def _gradflow_reduce_step(self, grads: List[Any], trainable_variables=None) -> List[Any]:
        if self._gradflow_local_ids:
            variables = (self._trainable_variables if trainable_variables is None
                         else trainable_variables)
            return self._gradflow_reduce_partial(grads, list(variables))
        return self._gradflow_reduce(grads, trainable_variables)

    def _gradflow_before_loss_scale(self, grads: List[Any], trainable_variables=None) -> List[Any]:
        """Called by a LossScaleOptimizer around this one before its finite
        check (Note [LossScaleOptimizer], loss_scale.py): the reduced
        gradients (k = 1), or with k > 1 the local ones, made NaN on every
        rank when some rank's are not finite."""
        held = max_overwritten(self, grads, trainable_variables)  # Note [Overwritten variables]
        grads = self._gradflow_zeros_where_others_have_gradients(grads, trainable_variables)
        grads = self._gradflow_loss_scale_reduce(grads, trainable_variables)
        for i, g in held.items():
            grads[i] = g
        return grads

    def _gradflow_loss_scale_reduce(self, grads: List[Any], trainable_variables) -> List[Any]:
        if self.backward_passes_per_step == 1:
            return self._gradflow_reduce_step(grads, trainable_variables)
        wire = wire_code(self.compression)
        if wire > 0 or (wire < 0 and _native.config()["wire_dtype"] in ("fp16", "bf16")):
            raise ValueError("gradflow: a 16-bit wire (compression=Compression.fp16/bf16) with "
                             "backward_passes_per_step > 1 under a LossScaleOptimizer "
                             "(mixed_float16) is not supported: the accumulated reduction could "
                             "overflow after the loss scaler's check; use Compression.none or "
                             "backward_passes_per_step=1")
        return _nan_if_any_rank_not_finite(grads, self)

    def _gradflow_reduce_partial(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        # Shared gradients are reduced (named by their variables, the same on
        # every rank); local ones stay this rank's, divided by size with
        # scale_local_gradients (Horovod's scaling).
        local = [id(v) in self._gradflow_local_ids for v in variables]
        shared = [i for i, is_local in enumerate(local) if not is_local]
        out = list(grads)
        for i, r in zip(shared, self._gradflow_reduce([grads[i] for i in shared],
                                                      [variables[i] for i in shared])):
            out[i] = r
        if self.scale_local_gradients:
            for i, is_local in enumerate(local):
                if is_local and out[i] is not None:
                    out[i] = _divided(out[i], process_set_size(self.process_set, "gradient"))
        return out

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The names _clip_gradients reduces under (strings: a list of
        # variables set here would join the optimizer's tracked variables).
        self._gradflow_step_names = tuple(self._gradflow_names(len(grads), trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        # With gradient accumulation Keras calls this once per real update, on
        # the accumulated gradients divided by k: reduce them here. Horovod
        # sums the k local gradients unless average_aggregated_gradients, so
        # undo Keras's division by k (before the reduction, as Horovod scales).
        if self.backward_passes_per_step > 1:
            grads = list(grads)
            if not self.average_aggregated_gradients:
                k = float(self.backward_passes_per_step)
                grads = [None if g is None else g * k for g in grads]
            grads = self._gradflow_reduce(grads, names=getattr(self, "_gradflow_step_names", None))
        return super()._clip_gradients(grads)

    def _gradflow_names(self, count: int, variables: Optional[List[Any]] = None) -> List[str]:
        """`<name>.<j>` for each gradient, j its variable's index in this
        optimizer: Keras passes only the trainable variables, so once a layer
        is frozen (fine-tuning) a position in that list is another variable,
        whose CSC residual and cached shape it took (found by the 2026-11-29
        combination audit). Positions where the variables are unknown (not
        built yet: the list it is built from)."""
        index: Any = range(count)
        if variables is not None and self.built and len(variables) == count:
            try:
                index = [self._get_variable_index(v) for v in variables]
            except KeyError:  # not this optimizer's: Keras's apply() raises its error
                pass
        return [f"{self.gradflow_name}.{i}" for i in index]

    def _gradflow_reduce(self, grads: List[Any], variables: Optional[List[Any]] = None,
                         names: Optional[Any] = None) -> List[Any]:
        if names is None or len(names) != len(grads):
            names = self._gradflow_names(len(grads), variables)
        backend = keras.backend.backend()
        if backend == "tensorflow":
            from ..tensorflow.gradient_tape import reduce_gradients
            return reduce_gradients(grads, names, self.op, self.compression,
                                    lambda: self.sparse_ratio, self.sparse_as_dense,
                                    self.gradient_predivide_factor, self.process_set,
                                    round_tag=self._gradflow_hyper)
        if backend == "torch":
            return _reduce_eager_numpy(grads, names, self)
        raise NotImplementedError(
            f"gradflow.keras.DistributedOptimizer supports the tensorflow and torch Keras "
            f"backends, not {backend!r} (a jitted JAX step cannot call the host core)")


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: Optional[str] = None,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                         backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Optional[Any] = None,
                         process_set: Optional[ProcessSet] = global_process_set,
                         scale_local_gradients: bool = True, *,
                         sparse_ratio: Optional[float] = None) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class and config) whose updates use
    gradients averaged (op=Average) or summed (op=Sum) across ranks.

    Horovod 0.28's signature (horovod.tensorflow.keras.DistributedOptimizer),
    positional order included. `device_dense` / `device_sparse` are accepted
    and ignored (GPU placement; gradflow reduces on the host).
    `scale_local_gradients` divides the gradients of variables registered as
    local (`register_local_var`, PartialDistributedOptimizer) by the number of
    members of `process_set`.
    `num_groups` / `groups` (explicit fusion groups) are not supported and
    raise ValueError. `process_set`: gradients are reduced over that
    registered set's members (Average divides by its size); only members
    may wrap (ValueError otherwise).

    `backward_passes_per_step=k`: gradients are aggregated locally over k
    batches and communicated once every k batches; the update uses their sum,
    or their mean over the k batches with `average_aggregated_gradients=True`.

    Gradient i of the update is named `<name>.<i>` in the core (name defaults
    to "DistributedOptimizer.<optimizer name>"). `compression` selects the
    wire format, `sparse_as_dense` makes IndexedSlices dense before the
    allreduce (otherwise they are allgathered). gradflow only (keyword):
    `sparse_ratio`, coarse-grained sparse communication (mutable per step
    through `.sparse_ratio`)."""
    del device_dense, device_sparse  # documented no-ops on CPU
    _loss_scale.install()  # Note [LossScaleOptimizer]: also when compile wraps this one
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"gradflow: DistributedOptimizer needs a keras.optimizers.Optimizer, got {optimizer!r}")
    if getattr(optimizer, "_gradflow_wrapped", False):
        raise ValueError("gradflow: the optimizer is already a DistributedOptimizer")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"gradflow: backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    # GRADFLOW_SPARSE_RATIO's limits (settings_check.py), before anything
    # else reads it as a number.
    check_sparse_ratio(sparse_ratio, "DistributedOptimizer")
    if num_groups or groups is not None:
        raise ValueError("gradflow: DistributedOptimizer(num_groups=, groups=) is not supported "
                         "(gradflow fuses gradients by its own bucket size, "
                         "GRADFLOW_FUSION_THRESHOLD); leave them at 0 / None")
    member_id(process_set, "DistributedOptimizer")  # registered, and this rank a member
    if reduce_op(op) != Average and float(gradient_predivide_factor) != 1.0:
        # At construction, not at the first step inside fit (as Horovod).
        raise ValueError("gradflow: gradient_predivide_factor needs op=Average")
    _c.check_adasum_options(op, wire_code(compression), sparse_ratio, "DistributedOptimizer")
    base = optimizer.__class__
    if int(backward_passes_per_step) > 1 and isinstance(optimizer,
                                                        keras.optimizers.LossScaleOptimizer):
        # Keras refuses gradient accumulation on a LossScaleOptimizer itself.
        raise ValueError("gradflow: DistributedOptimizer(LossScaleOptimizer(...), "
                         "backward_passes_per_step>1) is not supported (Keras has no gradient "
                         "accumulation on a LossScaleOptimizer); put the LossScaleOptimizer "
                         "around instead: LossScaleOptimizer(DistributedOptimizer(opt, "
                         "backward_passes_per_step=k))")
    if int(backward_passes_per_step) > 1 and isinstance(optimizer,
                                                        keras.optimizers.MultiOptimizer):
        # (Keras's MultiOptimizer takes no gradient_accumulation_steps: a TypeError.)
        raise ValueError("gradflow: DistributedOptimizer(MultiOptimizer(...), "
                         "backward_passes_per_step>1) is not supported (a MultiOptimizer has no "
                         "gradient accumulation); wrap the optimizers inside it instead: "
                         "MultiOptimizer(OptimizerMap(DistributedOptimizer(opt, "
                         "backward_passes_per_step=k), ...))")
    settings = dict(compression=compression, op=op, sparse_ratio=sparse_ratio,
                    sparse_as_dense=sparse_as_dense,
                    gradient_predivide_factor=gradient_predivide_factor,
                    average_aggregated_gradients=average_aggregated_gradients,
                    process_set=process_set, scale_local_gradients=scale_local_gradients)
    # Same module and name as the user's class: a saved model reloads with the
    # plain optimizer (wrap it again after loading). from_config on the
    # wrapped class wraps again, with these settings (_DistributedMixin).
    cls = type(base.__name__, (_DistributedMixin, base),
               {"__module__": base.__module__, "_gradflow_base": base,
                "_gradflow_settings": settings,
                "_gradflow_passes": int(backward_passes_per_step),
                # Note [Saved accumulation]: a .keras file says backward_passes_per_step.
                "save_assets": _saved_accumulation.save_assets,
                "load_assets": _saved_accumulation.load_assets})
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError("gradflow: use backward_passes_per_step or the optimizer's "
                             "gradient_accumulation_steps, not both")
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
    dist = super(_DistributedMixin, cls).from_config.__func__(cls, config)
    dist._gradflow_setup(name or default_name(optimizer), compression, op,
                         sparse_ratio, backward_passes_per_step, sparse_as_dense,
                         gradient_predivide_factor, average_aggregated_gradients, process_set,
                         scale_local_gradients)
    return dist


def _snake_case(name: str) -> str:
    """Keras's auto-name of a class ("SGD" -> "sgd", "AdamW" -> "adam_w")."""
    try:
        from keras.src.utils.naming import to_snake_case  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a Keras without it: its rule
        def to_snake_case(n: str) -> str:
            n = re.sub(r"\W+", "", n)
            n = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", n)
            return re.sub("([a-z])([A-Z])", r"\1_\2", n).lower()
    return to_snake_case(name)


# DistributedOptimizers made so far in this process, per optimizer class.
_wrapped_count: Dict[str, int] = {}


def default_name(optimizer: keras.optimizers.Optimizer) -> str:
    """The reduction name prefix of a DistributedOptimizer given no `name`.
    An optimizer the user named keeps that name. One Keras named itself
    ("sgd", "sgd_1", ...: a per-process count of *every* optimizer made) is
    numbered by the DistributedOptimizers of its class made in this process
    instead, which every rank makes alike: a plain optimizer that one rank
    alone made (an evaluation-only compile) used to shift that rank's names,
    and the job stalled."""
    cls = type(optimizer).__name__
    auto = re.fullmatch(re.escape(_snake_case(cls)) + r"(_\d+)?", optimizer.name)
    if not auto:
        return f"DistributedOptimizer.{optimizer.name}"
    k = _wrapped_count.get(cls, 0)
    _wrapped_count[cls] = k + 1
    return f"DistributedOptimizer.{cls}" + (f".{k}" if k else "")


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = Compression.none, sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: ReduceOp = Average,
                                groups: Optional[Any] = None,
                                process_set: Optional[ProcessSet] = global_process_set,
                                local_layers: Any = None, scale_local_gradients: bool = True
                                ) -> keras.optimizers.Optimizer:
    """A DistributedOptimizer that does not reduce the gradients of the
    trainable weights of `local_layers` (a Keras layer or a list of them):
    each rank updates those with its own gradient (divided by the number of
    members of `process_set` with `scale_local_gradients`, as Horovod 0.28),
    so they may differ between ranks while every other weight stays
    identical. Other arguments as DistributedOptimizer (Horovod's
    horovod.keras signature)."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("gradflow: all local_layers must be keras.layers.Layer objects")
    dist = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                                sparse_as_dense, gradient_predivide_factor, op, groups=groups,
                                process_set=process_set,
                                scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            dist.register_local_var(var)
    return dist


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` came from DistributedOptimizer."""
    return bool(getattr(optimizer, "_gradflow_wrapped", False))
