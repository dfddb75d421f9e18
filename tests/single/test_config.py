"""Configuration parsing (no MPI launcher): every GRADFLOW_* key is
declared once in native/config.cc; bad values are rejected with the range."""
import os
import subprocess
import sys
import tempfile

import pytest

from _launch import ROOT, in_place_build
from gradflow import _native

KEYS = {k["env"]: k for k in _native.config_keys()}


def test_keys_have_flags_help_and_defaults():
    assert {"GRADFLOW_FUSION_THRESHOLD", "GRADFLOW_CYCLE_TIME", "GRADFLOW_WIRE_DTYPE",
            "GRADFLOW_ALLREDUCE_ALGO", "GRADFLOW_SPARSE_RATIO", "GRADFLOW_TIMEOUT"} <= set(KEYS)
    for k in KEYS.values():
        assert k["flag"].startswith("--") and k["help"] and k["type"] in ("int", "float", "choice", "string",
                                                                        "bool")
        if k["type"] != "string":
            _native.validate_config({k["env"]: k["default"]})  # defaults are valid
    assert KEYS["GRADFLOW_FUSION_THRESHOLD"]["scale"] == 1048576.0


@pytest.mark.parametrize("env,value,fragment", [
    ("GRADFLOW_CYCLE_TIME", "-1", "out of range"),
    ("GRADFLOW_CYCLE_TIME", "abc", "not a number"),
    ("GRADFLOW_FUSION_THRESHOLD", "1.5", "not an integer"),
    ("GRADFLOW_WIRE_DTYPE", "fp8", "not one of"),
    ("GRADFLOW_ALLREDUCE_ALGO", "tree", "not one of"),
    ("GRADFLOW_SPARSE_RATIO", "0", "out of range"),
    ("GRADFLOW_SPARSE_RATIO", "1.5", "out of range"),
    ("GRADFLOW_TIMEOUT", "0", "out of range"),
    ("GRADFLOW_TIMELINE_MARK_CYCLES", "2", "not a boolean"),
    ("GRADFLOW_POOL_MERGE", "2", "out of range"),
    ("GRADFLOW_POOL_MERGE", "yes", "not a number"),
    ("GRADFLOW_LOG_LEVEL", "verbose", "not one of"),
])
def test_bad_values_rejected_with_range(env, value, fragment):
    with pytest.raises(_native.GradflowError) as e:
        _native.validate_config({env: value})
    msg = str(e.value)
    assert env in msg and fragment in msg and "Accepted" in msg and KEYS[env]["flag"] in msg


@pytest.mark.parametrize("env,value,bounds", [
    # Help texts that name no upper bound (or none at all): the message does.
    ("GRADFLOW_STALL_CHECK_TIME", "100000", "0 <= value <= 86400"),
    ("GRADFLOW_STALL_SHUTDOWN_TIME", "-1", "0 <= value <= 86400"),
    ("GRADFLOW_FUSION_THRESHOLD", "2000000000000", "0 <= value <= 1000000000000"),
    ("GRADFLOW_POOL_BUCKET_BYTES", "100", "4096 <= value <= 1000000000000"),
    ("GRADFLOW_SPARSE_RATIO", "1e-9", "1e-06 <= value <= 1"),
])
def test_out_of_range_names_the_bounds(env, value, bounds):
    with pytest.raises(_native.GradflowError) as e:
        _native.validate_config({env: value})
    assert f"out of range {bounds}" in str(e.value), str(e.value)


@pytest.mark.parametrize("env,value", [
    ("GRADFLOW_LOG_LEVEL", "DEBUG"), ("GRADFLOW_LOG_LEVEL", "Trace"), ("GRADFLOW_WIRE_DTYPE", "FP16"),
    ("GRADFLOW_TIMELINE_MARK_CYCLES", "1"), ("GRADFLOW_TIMELINE_MARK_CYCLES", "False"),
])
def test_choices_and_booleans_in_any_case(env, value):
    _native.validate_config({env: value})  # Horovod spells log levels in upper case


def test_unknown_override_rejected():
    with pytest.raises(_native.GradflowError, match="unknown setting"):
        _native.validate_config({"GRADFLOW_NOPE": "1"})


def _run(code, env=None):
    e = dict(os.environ, **(env or {}))
    if in_place_build():
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=60, cwd=tempfile.gettempdir())


def test_init_rejects_invalid_environment():
    p = _run("import gradflow as gf\ntry:\n gf.init()\nexcept gf.GradflowError as e:\n print('REJECTED', e)",
             {"GRADFLOW_CYCLE_TIME": "-5"})
    assert "REJECTED" in p.stdout and "GRADFLOW_CYCLE_TIME" in p.stdout, p.stdout + p.stderr


def test_use_before_init_raises():
    code = ("import numpy as np, gradflow as gf\n"
            "for f in (gf.rank, gf.size, lambda: gf.allreduce(np.ones(2)), lambda: gf.barrier(),\n"
            "          gf.mpi_comm):\n"
            "  try:\n    f()\n    print('NO ERROR')\n"
            "  except gf.GradflowError as e:\n"
            "    assert isinstance(e, ValueError), type(e)\n"
            "    assert 'call gradflow.init() (or hvd.init()) first' in str(e); print('OK')\n")
    p = _run(code)
    assert p.stdout.split() == ["OK"] * 5, p.stdout + p.stderr


def test_single_process_without_launcher_and_reinit():
    code = ("import numpy as np, gradflow as gf\n"
            "gf.init(); assert gf.size() == 1 and gf.rank() == 0\n"
            "assert (gf.allreduce(np.arange(3.0), op=gf.Sum) == np.arange(3.0)).all()\n"
            "gf.shutdown(); assert not gf.is_initialized()\n"
            "gf.init(); assert gf.allgather(np.ones((2, 2))).shape == (2, 2); print('DONE')\n")
    p = _run(code)
    assert "DONE" in p.stdout, p.stdout + p.stderr


def test_import_does_not_pull_frameworks():
    p = _run("import sys, gradflow\nprint('torch' in sys.modules, 'tensorflow' in sys.modules)")
    assert p.stdout.split() == ["False", "False"], p.stdout + p.stderr
