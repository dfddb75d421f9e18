# gradflow/tensorflow/functions.py — helpers on variable lists: broadcast_variables.
# Translates variables to numpy crossings only; no communication logic.
"""`broadcast_variables(variables, root_rank)`: make every rank's variables
equal to the root's (typically once, after creating the model and optimizer)."""
from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from .. import collectives as _c
from .ops import _check_dtype, _cross, op_name


def broadcast_variables(variables: Sequence[tf.Variable], root_rank: int = 0,
                        name: Optional[str] = None) -> Optional[tf.Operation]:
    """Assign root's values to `variables` on every rank, in one host crossing
    (all broadcasts submitted, then waited). Variable i is named `<name>.<i>`;
    a rank with a different variable list gets an error naming that tensor.
    Eagerly it returns None; inside tf.function, the group of assignments."""
    variables = list(variables)
    if not variables:
        return None
    base = op_name("broadcast", name)
    values = [tf.convert_to_tensor(v) for v in variables]
    for v in values:
        _check_dtype(v, "broadcast")
    root = int(root_rank)

    def fn(*arrays):
        handles = [_c.broadcast_async(a, root, f"{base}.{i}") for i, a in enumerate(arrays)]
        return [h.wait() for h in handles]

    outs: List[tf.Tensor] = _cross(fn, values, [v.dtype for v in values],
                                   [v.shape for v in values], f"broadcast_variables {base!r}")
    assigns = [v.assign(o) for v, o in zip(variables, outs)]
    return None if tf.executing_eagerly() else tf.group(*assigns)
