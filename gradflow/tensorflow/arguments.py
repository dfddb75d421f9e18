# gradflow/tensorflow/arguments.py — the TensorFlow ops' argument checks, run
# once the collective is named (Note [Checks after naming] in
# gradflow/_withdrawal.py), in both of TensorFlow's modes. Owns when a check's
# failure is raised and which names it withdraws; the checks themselves are
# the callers' (ops.py, scatter_ops.py).
"""`Checked`: an op's arguments checked after its names are drawn.

Why after: an argument can be bad on one rank alone (an op or root computed
from that rank's data, an unsupported dtype there). Checked before naming,
that rank raised and the others waited for the collective until
GRADFLOW_TIMEOUT; unnamed, its auto-name counter fell one behind theirs and
every later unnamed collective paired its call k with their call k+1,
silently (3 ranks, `op='bogus'` on rank 1, then unnamed Sum allreduces of
[1 + 10 r]*3: rank 1 got [31 33 35], mixed with the failed call's data,
where 33 was right, and ranks 0 and 2 got 34 for 33, then 37 for 36).

Eagerly the failure is raised at once, after withdrawing the op's names:
every rank fails them (`GradflowError` quoting the error) and the counters
stay in step, as in numpy and torch.

Inside `tf.function` a failure is not raised while tracing: a rank whose
trace fails never runs the graph, so the other ranks, which traced theirs,
would wait for every collective of it (the ones before the bad op too). The
node is built as usual and raises at run time instead, from its crossing,
withdrawing the names first: every rank's graph has the same collectives
under the same names, the ones before the bad op pair as usual, and the run
stops at the bad op on every rank (stateful nodes run in program order).
The bad rank's error then surfaces as TensorFlow reports a Python error from
a host callback (`InvalidArgumentError` for a ValueError or TypeError,
quoting it), the others' as the GradflowError quoting it.

Which names: those the other ranks submit before they wait (one crossing's
names: a grouped op's members, a list submitted together), never a later
crossing's. The others stop at the first failure and never submit a later
one; a withdrawal left for it would fail that name's next, healthy call.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import tensorflow as tf

from .._withdrawal import withdraw_all


class Checked:
    """`check()` run now, for the crossing that submits `names` (of native
    `kind`, on `process_set` as the caller passed it; `group_size`: they are
    one grouped op of that length, 0: not). Eagerly a failure withdraws the
    names and raises here; while tracing it is kept, and `get()` (called
    first thing in the crossing, before anything is submitted) withdraws
    and raises it at run time. `value`: what `check()` returned, None after
    a failure (trace-time code must then build something that type-checks;
    it never runs past the failing crossing)."""

    __slots__ = ("value", "error", "kind", "names", "process_set", "group_size")

    def __init__(self, check: Callable[[], Any], kind: int, names: Sequence[str],
                 process_set: Any = None, group_size: int = 0):
        self.kind, self.names, self.process_set = kind, list(names), process_set
        self.group_size = group_size
        try:
            self.value, self.error = check(), None
        except Exception as exc:  # noqa: BLE001 - raised again, on every rank's terms
            self.value, self.error = None, exc
            if tf.executing_eagerly():
                self.get()

    @property
    def ok(self) -> bool:
        """The check passed on this rank."""
        return self.error is None

    def get(self) -> Any:
        """The checked value; after a failed check: withdraw the names
        (every rank fails them with this rank's error) and raise it."""
        if self.error is None:
            return self.value
        withdraw_all(self.kind, self.names, self.process_set, self.error, self.group_size)
        raise self.error


def converted(values: Sequence[Any], kind: int, names: Sequence[str], process_set: Any = None,
              group_size: int = 0) -> List[tf.Tensor]:
    """`tf.convert_to_tensor` of each of `values`, once `names` are drawn
    (Note [Checks after naming]): eagerly, a value that this rank alone
    cannot convert (a ragged list, text where the others pass numbers)
    withdraws the names, so the other ranks raise its error at once instead
    of waiting for them until GRADFLOW_TIMEOUT. While tracing, the trace
    fails on this rank (there is no node to defer the error to): uncaught,
    gradflow's excepthook aborts the others' run within seconds; caught
    while the program goes on, they wait until GRADFLOW_TIMEOUT (Note [A
    trace that fails on one rank], docs/tensorflow.md)."""
    if not tf.executing_eagerly():
        return [tf.convert_to_tensor(v) for v in values]
    return Checked(lambda: [tf.convert_to_tensor(v) for v in values], kind, names, process_set,
                   group_size).value
