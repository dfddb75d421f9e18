"""The rank output pump (gradflow/runner/output_pump.py): newline and
carriage-return pieces are prefixed and written whole, a terminal gets an
unfinished line after a pause, a pipe never gets partial copies, and the log
keeps the bytes unchanged."""
import io
import os
import threading
import time

from gradflow.runner.output_pump import pump


class _Log(io.BytesIO):
    def close(self):  # keep the bytes readable after pump() closes it
        self.closed_by_pump = True


def _run(chunks, tty, pause=0.0):
    r_src, w_src = os.pipe()
    r_out, w_out = os.pipe()
    log = _Log()
    out = []

    def drain():  # read concurrently: the output may exceed a pipe's buffer
        while True:
            data = os.read(r_out, 65536)
            if not data:
                return
            out.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    t = threading.Thread(target=pump, args=(r_src, w_out, b"[0]: ", log, tty, 0.05), daemon=True)
    t.start()
    for c in chunks:
        os.write(w_src, c)
        time.sleep(pause)
    os.close(w_src)
    t.join(10)
    assert not t.is_alive()
    os.close(w_out)
    reader.join(10)
    os.close(r_out)
    os.close(r_src)
    return b"".join(out), log


def test_lines_and_carriage_returns_are_prefixed_pieces():
    out, log = _run([b"hello\n\rstep 1\rstep 2", b"\rdone\n", b"\n", b"tail"], tty=False)
    assert out == b"[0]: hello\n[0]: step 1\r[0]: step 2\r[0]: done\n[0]: \n[0]: tail\n"
    assert log.getvalue() == b"hello\n\rstep 1\rstep 2\rdone\n\ntail"
    assert log.closed_by_pump


def test_crlf_is_one_line_end():
    out, _ = _run([b"a\r\nb\r\n"], tty=False)
    assert out == b"[0]: a\r\n[0]: b\r\n"


def test_terminal_sees_an_unfinished_line_after_a_pause_and_a_pipe_does_not():
    chunks = [b"\rstep 1", b" more", b"\n"]
    out, _ = _run(chunks, tty=True, pause=0.3)
    assert out.startswith(b"[0]: step 1\r"), out
    assert out.endswith(b"[0]: step 1 more\n"), out
    out, _ = _run(chunks, tty=False, pause=0.3)
    assert out == b"[0]: step 1 more\n"


def test_an_endless_line_comes_out_in_bounded_pieces():
    out, _ = _run([b"x" * 200_000], tty=False)
    pieces = out.split(b"\n")[:-1]
    assert b"".join(p[len(b"[0]: "):] for p in pieces) == b"x" * 200_000
    assert all(len(p) <= (1 << 16) + 2 * len(b"[0]: ") + 1 for p in pieces)
