"""Async handles: what `*_async` returns, keeping buffers alive until done.

The native core works on raw addresses of caller-owned memory, so the
buffers must live until the core has finished with them, whatever the caller
does with the handle (Note [Handle lifetime] in native/tensor_queue.h): a
waited handle holds them until `wait()` returns; a handle dropped while in
flight hands them to `_orphans`, keyed by native handle id, until the core
reports that handle completed (`sweep()`, run on every submit). The core
discards the results of dropped handles, so nothing leaks either way.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _native

# Buffers of dropped handles still in flight: native handle id -> keep-alive
# (handle ids are unique in the process, across process sets).
_orphans: Dict[int, Any] = {}


def sweep() -> None:
    """Let go of the buffers of dropped handles the core has completed."""
    if _orphans:
        for h in _native.take_reaped():
            _orphans.pop(h, None)


def release(native: int, keep_alive: Any, process_set: int = 0) -> None:
    """The caller dropped native handle `native` (of process set
    `process_set`): the core forgets its result, and `keep_alive` stays
    referenced until the core is done with it."""
    _orphans[native] = keep_alive  # first: a sweep may see it completed at once
    if _native.release(native, process_set):
        _orphans.pop(native, None)


# shutdown() calls so far: a handle made before the latest one belonged to a
# runtime that is gone (its result with it).
_runtimes_stopped = 0


def forget_all() -> None:
    """After shutdown(): the stopped runtime completed every handle."""
    global _runtimes_stopped
    _runtimes_stopped += 1
    _orphans.clear()


def wait_all(handles: Sequence["Handle"]) -> List[Any]:
    """Every handle's result, in order. A failure is raised only after every
    handle is done, so nothing of a grouped op stays in flight when it fails
    (a retry under the same names would find the rest still pending)."""
    results: List[Any] = []
    error: Optional[Exception] = None
    for h in handles:
        try:
            results.append(h.wait())
        except Exception as e:  # noqa: PERF203 - each member must be waited on
            error = error or e
            results.append(None)
    if error is not None:
        raise error
    return results


class Handle:
    """An in-flight collective. Pass to `gradflow.synchronize` or `gradflow.poll`.
    Any number of threads may wait on it; each gets the result (or the error)."""

    __slots__ = ("native", "keep_alive", "finish", "_done", "_value", "_error", "name",
                 "wire_overflow", "_lock", "process_set", "_runtime")

    def __init__(self, native: Optional[int], keep_alive: tuple,
                 finish: Optional[Callable[[dict], Any]], name: str, process_set: int = 0):
        self.native = native  # None until a grouped op submits it (_runtime.submitting_group)
        self._runtime = _runtimes_stopped  # the runtime it belongs to (see _stale())
        self.process_set = process_set  # the core's id of the set whose engine runs it
        self.keep_alive = keep_alive
        self.finish = finish
        self.name = name
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()  # one thread takes the native result; others wait here
        #: True once done if a finite value overflowed the 16-bit wire (became
        #: inf): mixed-precision loss scaling treats it like a gradient overflow.
        self.wire_overflow = False

    def submitted(self, native: int) -> None:
        """A grouped op submitted this member (_runtime.submitting_group)."""
        self.native = native

    def _end_with(self, error: BaseException) -> None:
        """Done, failed with `error` (a second wait raises it too); the
        buffers are let go."""
        self._error = error
        self._done = True
        self.keep_alive = ()

    def never_submitted(self) -> None:
        """A grouped op failed before this member reached the core."""
        self._end_with(_native.GradflowError(f"gradflow: '{self.name}' was never submitted (its "
                                             "grouped op failed before it reached the core)"))

    def _stale(self) -> bool:
        """The runtime this handle belonged to was shut down before it was
        waited: its result is gone. Done, with an error saying so (the core
        would only say "not initialized" or, after a new init(), "unknown
        handle")."""
        if self._runtime == _runtimes_stopped:
            return False
        with self._lock:
            if not self._done:
                self._end_with(_native.GradflowError(
                    f"gradflow: '{self.name}' belonged to a runtime that shutdown() stopped "
                    "before this handle was waited; its result is gone"))
        return True

    def poll(self) -> bool:
        """True once the collective has completed (successfully or not)."""
        if self._done or self._stale():
            return True
        try:
            return _native.poll(self.native, self.process_set)
        except Exception:
            # Another thread inside wait() took the result from the core
            # (the core forgets a handle when its last waiter leaves) and has
            # not marked it done yet: it is done.
            if self._done or self._lock.locked():
                return True
            raise

    def wait(self) -> Any:
        """Block until done and return the result; raises GradflowError on
        failure. Ctrl-C in the main thread interrupts it (KeyboardInterrupt
        within 0.1 s); the collective goes on, and wait() may be called again."""
        if not self._done and not self._stale():
            with self._lock:
                if not self._done:
                    interruptible = threading.current_thread() is threading.main_thread()
                    try:
                        result = _native.wait(self.native, self.process_set, interruptible)
                    except Exception as e:
                        self._end_with(e)
                    else:  # (KeyboardInterrupt: not done, nothing remembered)
                        try:
                            self.wire_overflow = bool(result.get("wire_overflow", False))
                            self._value = self.finish(result) if self.finish else result
                        except BaseException as e:
                            self._error = e
                        finally:
                            self._done = True
                            self.keep_alive = ()
        if self._error is not None:
            raise self._error
        return self._value

    def __del__(self) -> None:
        # Dropped without wait(): the core may still be writing the buffers.
        if not getattr(self, "_done", True) and getattr(self, "native", None) is not None:
            try:
                release(self.native, self.keep_alive, self.process_set)
            except Exception:  # interpreter exit: the module may be half torn down
                pass

    def __repr__(self) -> str:
        return f"<gradflow.Handle {self.name!r} done={self._done}>"
