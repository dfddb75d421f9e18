"""Withdrawn names: a collective that fails on this rank between being named
and reaching the core is failed on every rank (native Note [Withdrawn
names], coordinator.h).

Why: the other ranks have submitted (or will submit) the same name. Left
alone they wait for it until GRADFLOW_TIMEOUT, and if the program catches
the error and calls again under that name, the new call is reduced with
their earlier one: this step's data paired with the last step's, on every
rank alike, silently. Withdrawing sends the core a request without buffers
that carries the error; every rank's handle of that name fails with it, and
the next calls pair afresh.

Bindings name a collective first, then prepare its buffers inside
`preparing(...)` (a user Compressor, staging, conversions), then call
`_runtime.submit`, which marks the name submitted (or withdraws it itself if
the core refuses it).

Note [Checks after naming]: the arguments are checked inside `preparing`
too (op, sparse_ratio, compression, root), not before the name is drawn.
An argument can be bad on one rank alone (an op or ratio computed from the
rank's own data): checked before naming, that rank raised while the others
waited for the name until GRADFLOW_TIMEOUT, and a program that caught the
error drew its next auto-name one behind theirs, so every later unnamed
collective paired its call k with their call k+1, silently (3 ranks,
op='bogus' on rank 1, unnamed Sum allreduces after: rank 1 got 3 where
ranks 0 and 2 got 13). Withdrawn, the name fails on every rank at once and
the counters stay in step. The same in every binding: torch's differentiable
reducescatter and grouped ops pass op, scales and a user Compressor's work
to where the name is drawn (torch/scatter_ops.py, grouped_ops.py
`preparing_group`); TensorFlow's ops check in `tensorflow/arguments.py`
`Checked` (eagerly as here; inside tf.function the node raises at run time,
since a rank whose trace failed would never run the graph the others run).

Only a bad `name` or `process_set` still raises before naming: there is no
name to withdraw, and none can be guessed. Drawing an auto-name and
withdrawing it would be right only if the others passed no name on that
set; if they passed one, the withdrawal would fail their next unnamed call
and put this rank's counter one ahead of theirs, the very fault above.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional, Sequence, Set

from . import _native
from . import process_sets as _process_sets


class preparing:
    """`with preparing(kind, name, process_set):` around the code that
    prepares collective `name` (of `kind`, on `process_set` as the caller
    passed it) and submits it: if the block raises before the submit, every
    rank fails `name` with this rank's error instead of waiting for it.
    A class, not a generator: it is on every call's path (a generator-based
    context manager cost 1.2 us per 4 KiB call, this one a fraction)."""

    __slots__ = ("kind", "name", "process_set", "submitted", "_token")

    def __init__(self, kind: int, name: str, process_set: Any = None):
        self.kind = kind
        self.name = name
        self.process_set = process_set
        self.submitted = False  # it reached the core (or a grouped op answers for it)

    def __enter__(self) -> "preparing":
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _current.reset(self._token)
        if exc is not None and not self.submitted:
            from . import _runtime  # (imports this module)
            if _runtime.in_group():
                return False  # the grouped op withdraws all its members itself
            withdraw_all(self.kind, [self.name], self.process_set, exc)
            mark_submitted(self.name)  # withdrawn once only (an enclosing reaching_core)
        return False


_current: contextvars.ContextVar[Optional[preparing]] = contextvars.ContextVar(
    "gradflow_preparing", default=None)


# Names that reached the core (or were withdrawn) inside the innermost
# `reaching_core` block.
_reached: contextvars.ContextVar[Optional[Set[str]]] = contextvars.ContextVar(
    "gradflow_reached", default=None)


def mark_submitted(name: str) -> None:
    """`name` reached the core (or its grouped op), or was withdrawn already:
    `preparing` and `reaching_core` leave it be (a second withdrawal, after
    the first completed, would fail the name's next call)."""
    state = _current.get()
    if state is not None and state.name == name:
        state.submitted = True
    reached = _reached.get()
    if reached is not None:
        reached.add(name)


@contextlib.contextmanager
def reaching_core(names: Sequence[str], kind: int, process_set: Any = None) -> Iterator[None]:
    """The block submits collectives `names` one by one (a list that is not
    a grouped op): if it raises, those that did not reach the core are
    withdrawn, so the other ranks do not wait for the rest of the list. A
    name that did is left alone even if it has completed since: a
    withdrawal then would fail the name's next call instead."""
    reached: Set[str] = set()
    token = _reached.set(reached)
    try:
        yield
    except BaseException as exc:
        withdraw_all(kind, [n for n in names if n not in reached], process_set, exc)
        raise
    finally:
        _reached.reset(token)


# Request::group_size of an empty list's withdrawal (native kEmptyGroupList,
# group_lists.h).
EMPTY_GROUP_LIST = -1


def announce_empty_group(kind: int, base: str, process_set: Any) -> None:
    """A grouped op named `base` got an empty list on this rank. It submits
    nothing, so without a word the ranks that passed tensors would wait
    for their members until GRADFLOW_TIMEOUT: withdraw `<base>.0` with the
    empty-list marker (native Note [Grouped lists]). If another rank
    submitted members, the job aborts at once on every rank naming both
    lengths; if every rank passed an empty list, nothing happens."""
    withdraw_all(kind, [f"{base}.0"], process_set, ValueError("an empty list"),
                 EMPTY_GROUP_LIST)


def withdraw_all(kind: int, names: Sequence[str], process_set: Any, exc: BaseException,
                 group_size: int = 0) -> None:
    """`withdraw` for each of `names` on `process_set` (as the caller passed it)."""
    from ._runtime import _KIND_NAMES  # (imports this module; a failure path only)
    try:
        ps = _process_sets.process_set_id(process_set, _KIND_NAMES[kind])
    except Exception:
        return  # an unregistered set: nothing of it reached the core
    for n in names:
        withdraw(kind, n, ps, exc, group_size)


def withdraw(kind: int, name: str, ps: int, exc: BaseException, group_size: int = 0) -> bool:
    """Tell process set `ps`'s engine (the core's id) that this rank will
    not submit `name`; every rank fails it with `exc`'s text. Never raises
    (the caller is raising already); False if nothing was sent (not
    initialized, the name is in flight here after all, or the runtime is
    closed)."""
    try:
        if not _native.is_initialized():
            return False
        text = f"{type(exc).__name__}: {exc}"
        if len(text) > 2000:  # every rank's error carries it
            text = text[:2000] + " ..."
        return bool(_native.withdraw(kind, name, ps, text, group_size))
    except Exception:
        return False
