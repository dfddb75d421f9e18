# gradflow/tensorflow/functions.py — helpers on variable lists and Python
# objects: broadcast_variables, broadcast_global_variables, broadcast_object,
# broadcast_object_fn, allgather_object. Translates variables to numpy
# crossings and objects to pickled bytes only; no communication logic.
"""Horovod's `horovod.tensorflow.functions` for gradflow:

* `broadcast_variables(variables, root_rank)`: make every rank's variables
  equal to the root's (typically once, after creating model and optimizer);
* `broadcast_global_variables(root_rank)`: the same for TF1-style graph
  global variables (graph mode only, as Horovod);
* `broadcast_object`, `broadcast_object_fn`, `allgather_object`: any
  picklable Python object (cloudpickle when installed, as Horovod, else
  pickle), sent as a uint8 array: first its length, then its bytes. An
  object that cannot be pickled raises on every rank at once (the pickling
  rank its own error, the others a GradflowError quoting it):
  `gradflow.collectives.broadcast_pickled` / `allgather_pickled`.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from .. import collectives as _c
from ..process_sets import ProcessSet, global_process_set, process_set_id
from .ops import broadcast_, op_name

try:  # Horovod pickles with cloudpickle (lambdas, local classes); plain pickle otherwise
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - depends on the environment
    import pickle as _pickle


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int,
                        process_set: Optional[ProcessSet] = global_process_set,
                        inplace: bool = False, *, name: Optional[str] = None) -> Any:
    """Assign root's values to `variables` on every member of `process_set`
    (default: all ranks; `root_rank` is global), in one host crossing
    (all broadcasts submitted, then waited). Variable i is named `<name>.<i>`;
    a rank with a different variable list gets an error naming that tensor.
    Horovod 0.28's signature; `inplace` changes nothing (gradflow always
    assigns the broadcast values into the variables). Eagerly it returns None;
    inside tf.function, the group of assignments."""
    del inplace  # both of Horovod's paths end with the same variable values
    # An empty list too: broadcast_ tells the ranks whose lists are not empty
    # (native Note [Grouped lists]) rather than leave them waiting.
    values = broadcast_(list(variables), root_rank, name=name, process_set=process_set)
    return None if tf.executing_eagerly() else tf.group(*values)


def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcast every TF1 global variable (`tf.compat.v1.global_variables()`)
    from `root_rank` (graph mode only: like Horovod it raises RuntimeError when
    executing eagerly, where TF keeps no global variable collection). Returns
    the op to run in the session."""
    if tf.executing_eagerly():
        raise RuntimeError("gradflow: broadcast_global_variables() does not support eager "
                           "execution (TensorFlow 2 keeps no global variables); use "
                           "broadcast_variables(<model/optimizer variables>, root_rank) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = global_process_set) -> Any:
    """Root's `obj` (pickled) on every member of `process_set` (default: all
    ranks; `root_rank` is global); the other ranks' `obj` is ignored (may be
    None). Runs immediately in Python, in any TF mode; `session`
    (TF1) is accepted and unused. `name` defaults to gradflow's counter-based
    name (Horovod uses the object's type name, which breaks when ranks pass
    objects of different types)."""
    del session
    base = op_name("broadcast", name, process_set)
    return _c.broadcast_pickled(obj, root_rank, f"{base}.sz", f"{base}.t", process_set,
                                _pickle.dumps, _pickle.loads, "broadcast_object")


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: Optional[ProcessSet] = global_process_set
                        ) -> Callable[[Any], Any]:
    """A function `f(obj)` that broadcasts `obj` from `root_rank` like
    `broadcast_object` (Horovod builds its graph once; gradflow needs no graph,
    so `f` calls broadcast_object with these arguments; call number k is named
    `<name>.<k>`)."""
    del session
    process_set_id(process_set, "broadcast_object_fn")  # an unregistered set raises now
    base = name or "broadcast_object_fn"
    calls = iter(range(2 ** 62))

    def _bcast(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, name=f"{base}.{next(calls)}",
                                process_set=process_set)

    return _bcast


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = global_process_set) -> List[Any]:
    """Every member's `obj` (pickled), as a list in rank order (members of
    `process_set`, default all ranks). Runs immediately
    in Python; `session` (TF1) is accepted and unused; `name` as in
    `broadcast_object`."""
    del session
    base = op_name("allgather", name, process_set)
    return _c.allgather_pickled(obj, f"{base}.sz", f"{base}.t", process_set, _pickle.dumps,
                                _pickle.loads, "allgather_object")
