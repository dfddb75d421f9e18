"""The elastic `run` loop (Horovod's run_fn): run the training function;
when a peer is lost, roll back to the last commit, re-form the group and
go on; when hosts were added or removed, re-form and go on from the current
state.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from .._basics import HorovodInternalError, HostsUpdatedInterrupt
from . import worker as _worker


# Note [A stall is no lost peer]: the coordinator fails a stalled collective
# (GRADFLOW_TIMEOUT, GRADFLOW_STALL_SHUTDOWN_TIME) on every rank in one
# cycle, with a message saying so; it is the program's error (a commit() on
# some ranks only), like a shape mismatch, and every rank re-raises it. But
# the rank that raises first tells the others to stop (its excepthook's
# abort: their runtime fails fatally) and exits (the driver then tells them
# a peer died); a rank that reaches the check below even 1.4 ms later
# (measured) found either there: it rolled back and asked for a generation
# its peer's exit had made impossible (2 workers, --min-np 2: a wait of
# --elastic-timeout, 600 s; 1 in 19 runs for helper-29, 1 in 6 with a
# discovery script here). The error itself decides: a stall is re-raised
# whatever arrived after it, and so is any error the ranks agreed on (the
# GradflowError's `job_wide`: a shape or dtype mismatch, different list
# lengths, step tags; before, only the stall text was recognised and a
# mismatch raced the same way). Through a TensorFlow op the exception
# arrives as a tf.errors.OpError that keeps the message but not
# `job_wide`: there the stall text is what is recognised.
STALL_MARK = "failing it on every rank"


def _peer_lost(error: Optional[BaseException] = None) -> bool:
    """Whether this generation really lost a peer (the driver said so, or
    communication failed fatally) when `error` was raised. An error every
    rank got alike (`job_wide`: a shape mismatch, a stall) would fail again
    after every reset: it is re-raised whatever arrived after it."""
    from .. import _native  # noqa: PLC0415
    if error is not None and (getattr(error, "job_wide", False) or STALL_MARK in str(error)):
        return False  # Note [A stall is no lost peer]
    link = _worker.current()
    return (link is not None and link.failure is not None) or _native.failed_fatally()


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Wrap `func(state, *args, **kwargs)` in the elastic loop; `reset`
    shuts the runtime down and initializes it on the next generation."""

    @functools.wraps(func)
    def wrapper(state, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if not _peer_lost(e):
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            skip_sync = not _reset_and_agree(not skip_sync, reset)
            state.on_reset()

    return wrapper


def _reset_and_agree(want_sync: bool, reset: Callable[[], None]) -> bool:
    """reset(), then whether to sync the state in the new generation. This
    worker's wish (skip only when hosts were only removed) is decided before
    it knows who else joins; the driver decides for the whole generation
    (a newcomer, or any member that wants it, means a sync), since one rank
    syncing while another does not stalls both in the broadcast."""
    link = _worker.current()
    if link is not None:
        link.wants_sync = want_sync
    reset()
    link = _worker.current()
    return want_sync if link is None else link.sync


def reset_runtime() -> None:
    """shutdown() then init(): init() joins the next generation."""
    from .. import _runtime  # noqa: PLC0415
    _runtime.shutdown()
    _runtime.init()
