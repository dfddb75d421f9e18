"""An uncaught exception on an initialized rank: gradflow's excepthook tells
the peers, prints the traceback and the process leaves with code 1 (without
MPI_Finalize). Under PYTHONUNBUFFERED (gradflowrun sets it) the default hook
writes each piece of a line separately, and mpiexec then put the peers'
abort messages inside the traceback's last line; gradflow writes it whole.
A hook the program installed before init() is still the one that prints."""
import ast
import os
import subprocess
import sys

import gradflow

SRC = os.path.dirname(os.path.dirname(os.path.abspath(gradflow.__file__)))

PROGRAM = """
import sys
log = open(sys.argv[1], "w")


class Recorder:
    # Logs every write() call made on stderr, then passes it on.
    def __init__(self, inner):
        self.inner = inner

    def write(self, s):
        log.write(repr(s) + "\\n")
        log.flush()
        return self.inner.write(s)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


if sys.argv[2] == "user-hook":
    def hook(t, e, tb):
        sys.stderr.write("user hook saw " + t.__name__ + "\\n")
    sys.excepthook = hook
import gradflow
gradflow.init()
sys.stderr = Recorder(sys.stderr)
raise ValueError("boom in the program")
"""


def run(tmp_path, mode):
    log = tmp_path / "writes.txt"
    program = tmp_path / "program.py"  # a file, so the traceback shows the source line
    program.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, str(program), str(log), mode], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    writes = [ast.literal_eval(line) for line in log.read_text().splitlines()]
    return r, writes


def test_traceback_is_one_write_and_the_exit_is_orderly(tmp_path):
    r, writes = run(tmp_path, "default")
    assert r.returncode == 1, r.stderr
    whole = [w for w in writes if w.startswith("Traceback (most recent call last)")]
    assert len(whole) == 1, writes
    assert whole[0].endswith("ValueError: boom in the program\n"), whole[0]
    assert 'raise ValueError("boom in the program")' in whole[0]
    # a user error, not a communication failure (the message said so before 2026-11-29)
    assert ("[gradflow rank 0] uncaught exception on this rank (the other ranks are told to "
            "stop); exiting with code 1 without MPI_Finalize") in r.stderr, r.stderr


def test_a_hook_installed_before_init_still_prints(tmp_path):
    r, writes = run(tmp_path, "user-hook")
    assert r.returncode == 1, r.stderr
    assert writes[0] == "user hook saw ValueError\n", writes
    assert "Traceback" not in r.stderr, r.stderr
