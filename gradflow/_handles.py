"""Async handles: what `*_async` returns, keeping buffers alive until done.

The native core works on raw addresses of caller-owned memory, so a handle
holds references to every array involved until `synchronize()` returns; the
optional `finish` turns the native result into the user's value.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from . import _native


class Handle:
    """An in-flight collective. Pass to `gradflow.synchronize` or `gradflow.poll`."""

    __slots__ = ("native", "keep_alive", "finish", "_done", "_value", "_error", "name",
                 "wire_overflow")

    def __init__(self, native: int, keep_alive: tuple, finish: Optional[Callable[[dict], Any]], name: str):
        self.native = native
        self.keep_alive = keep_alive
        self.finish = finish
        self.name = name
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None
        #: True once done if a finite value overflowed the 16-bit wire (became
        #: inf): mixed-precision loss scaling treats it like a gradient overflow.
        self.wire_overflow = False

    def poll(self) -> bool:
        """True once the collective has completed (successfully or not)."""
        return self._done or _native.poll(self.native)

    def wait(self) -> Any:
        """Block until done and return the result; raises GradflowError on failure."""
        if not self._done:
            try:
                result = _native.wait(self.native)
                self.wire_overflow = bool(result.get("wire_overflow", False))
                self._value = self.finish(result) if self.finish else result
            except BaseException as e:  # remembered so a second wait raises too
                self._error = e
            finally:
                self._done = True
                self.keep_alive = ()
        if self._error is not None:
            raise self._error
        return self._value

    def __repr__(self) -> str:
        return f"<gradflow.Handle {self.name!r} done={self._done}>"
