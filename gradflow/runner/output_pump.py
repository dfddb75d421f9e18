"""Forwards one output stream of a rank's command to the launcher's terminal
with the rank prefix (``[1]<stdout>: ...``). Owned here, used by
rank_wrapper.py; standard library only (the wrapper never imports gradflow).

Why not ``readline``: progress bars (tqdm, Keras' progbar) redraw one line
with carriage returns and print a newline only at the end, so a reader that
waits for newlines shows nothing until the job ends. The pump therefore cuts
the stream at ``\\n`` *and* ``\\r`` and writes each piece with one write
(so mpiexec keeps pieces of different ranks intact):

* ``text\\n`` → ``prefix text\\n``; ``text\\r`` → ``prefix text\\r``: the next
  piece, prefixed again, overwrites the line on a terminal, so the rank
  prefix stays visible and a bar animates in place.
* an empty piece before ``\\r`` (tqdm writes ``\\r`` *before* each update) is
  dropped: it would only print a bare prefix.
* text with no terminator yet (the bar's latest state, or a prompt) is
  shown after ``idle_flush`` seconds without more output, as
  ``prefix text\\r`` — only when the launcher's stream is a terminal
  (``tty=True``), because on a file or pipe that would add a partial copy of
  the line. The text stays buffered, so when its end arrives the whole line
  is written again over the partial one.

The per-rank log file (``--output-filename``) gets the bytes unchanged.
"""

from __future__ import annotations

import os
import select
from typing import BinaryIO, Optional

MAX_PIECE = 1 << 16  # a longer piece is cut: never held back indefinitely
IDLE_FLUSH_SECONDS = 0.2


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of ``data`` is out; a closed reader ends it quietly."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            return
        view = view[n:]


def _next_cut(buf: bytes) -> int:
    """Index of the end of the first piece of ``buf`` (its ``\\n``, its
    ``\\r``, or the ``\\n`` of a ``\\r\\n`` pair, which is one line end), or -1."""
    cuts = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
    if not cuts:
        return -1
    cut = min(cuts)
    return cut + 1 if buf[cut:cut + 2] == b"\r\n" else cut


def pump(src_fd: int, fd: int, prefix: bytes, log: Optional[BinaryIO], tty: bool = False,
         idle_flush: float = IDLE_FLUSH_SECONDS) -> None:
    """Copy ``src_fd`` to ``fd`` until end of file as described above (and
    verbatim to ``log``); closes ``log`` at the end."""
    buf = b""
    shown = b""  # the unterminated text last shown with a trailing \r
    try:
        while True:
            if tty and buf and buf != shown:
                ready, _, _ = select.select([src_fd], [], [], idle_flush)
                if not ready:  # quiet for a while: show the unfinished line
                    write_all(fd, prefix + buf + b"\r")
                    shown = buf
                    continue
            chunk = os.read(src_fd, MAX_PIECE)
            if not chunk:
                break
            if log:
                log.write(chunk)
                log.flush()
            buf += chunk
            while True:
                cut = _next_cut(buf)
                if cut < 0:
                    if len(buf) >= MAX_PIECE:  # an endless line: out in pieces
                        write_all(fd, prefix + buf + b"\n")
                        buf = shown = b""
                    break
                piece, buf = buf[:cut + 1], buf[cut + 1:]
                shown = b""
                if piece != b"\r":  # a bare \r (tqdm's leading one) shows nothing
                    write_all(fd, prefix + piece)
        if buf:
            write_all(fd, prefix + buf + b"\n")
    finally:
        if log:
            log.close()
