"""Keyword arguments with the meaning of a GRADFLOW_* variable (README,
"Configuration and tuning") get that variable's limits, read from the core
(native/config.cc through _native.validate_config), and a GradflowValueError
naming the keyword, the value and the accepted range, before anything is
communicated; GRADFLOW_TF_OVERLAP, read only by Python, is rejected at
init() as the core's settings are. Before: bucket_mb=0 / -1 silently meant
the 8 MiB default, bucket_mb=0.001 (1048 bytes) and sparse_ratio=1e-9 passed
although the variables refuse them, and GRADFLOW_TF_OVERLAP=7 failed only
when a tf.function step was traced. No launcher: the torch and numpy checks
run before init() in this process; TensorFlow, Keras and Lightning run in
one fresh interpreter of size 1."""
import math
import subprocess
import sys

import numpy as np
import pytest

from _launch import rank_env, run_cwd
from gradflow import _native, settings_check

torch = pytest.importorskip("torch")
import gradflow  # noqa: E402
import gradflow.torch as hvd  # noqa: E402

BAD_BUCKET_MB = [0, -1, 0.001, 4095 / 2**20, 1e7, True, "8", [8], math.nan, math.inf]
BAD_SPARSE_RATIO = [1e-9, 0.0, -1, 2.0, 1 + 1e-9, True, "0.5", math.nan, [0.5]]


def _assert_names(err: Exception, keyword: str, value, fragment: str) -> None:
    msg = str(err)
    assert isinstance(err, ValueError) and isinstance(err, _native.GradflowError), type(err)
    assert f"{keyword}={value!r}" in msg and "Accepted" in msg and fragment in msg, msg


@pytest.mark.parametrize("keyword,value,fragment",
                         [("bucket_mb", v, "at least 4096 bytes") for v in BAD_BUCKET_MB] +
                         [("sparse_ratio", v, "1e-6 <= value <= 1") for v in BAD_SPARSE_RATIO],
                         ids=repr)
def test_torch_optimizer_keywords_have_the_variables_limits(keyword, value, fragment):
    m = torch.nn.Linear(4, 2)
    with pytest.raises(_native.GradflowValueError) as e:
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=m.named_parameters(), **{keyword: value})
    _assert_names(e.value, keyword, value, fragment)


@pytest.mark.parametrize("call", [
    lambda: gradflow.allreduce(np.ones(2, np.float32), sparse_ratio=1e-9),
    lambda: gradflow.allreduce_async(np.ones(2, np.float32), sparse_ratio=-1),
    lambda: hvd.allreduce_async(torch.ones(2), sparse_ratio=1e-9),
    lambda: hvd.allreduce_async_(torch.ones(2), sparse_ratio="0.5"),
    lambda: hvd.grouped_allreduce_async_([torch.ones(2)], sparse_ratio=True),
], ids=["numpy", "numpy -1 (the core's 'unset')", "torch", "torch in place", "torch grouped"])
def test_allreduce_sparse_ratio_has_the_variables_limits(call):
    # Checked before the call needs init(); before, the core's own submit
    # check allowed (0, 1] and took -1 for "the setting".
    with pytest.raises(_native.GradflowValueError) as e:
        call()
    assert "allreduce: invalid sparse_ratio=" in str(e.value) and "1e-6" in str(e.value)


def test_accepted_values_and_the_core_encoding():
    assert settings_check.native_sparse_ratio(None, "t") == -1.0
    for ok in (1e-6, 0.5, 1, np.float32(0.25), np.float64(1.0)):
        assert settings_check.native_sparse_ratio(ok, "t") == float(ok)
    assert settings_check.pool_bucket_bytes(None, "t") == -1
    assert settings_check.pool_bucket_bytes(4096 / 2**20, "t") == 4096
    assert settings_check.pool_bucket_bytes(0.004, "t") == int(0.004 * 2**20)
    assert settings_check.pool_bucket_bytes(np.int64(8), "t") == 8 << 20


def test_other_variables_in_the_environment_do_not_matter(monkeypatch):
    # The keyword is checked with every other setting at its default: an
    # environment changed after init() cannot fail it or be named instead.
    monkeypatch.setenv("GRADFLOW_CYCLE_TIME", "-5")
    monkeypatch.setenv("GRADFLOW_SPARSE_RATIO", "7")
    assert settings_check.native_sparse_ratio(0.3125, "t") == 0.3125
    with pytest.raises(_native.GradflowValueError, match="GRADFLOW_SPARSE_RATIO") as e:
        settings_check.native_sparse_ratio(3.5, "t")
    assert "CYCLE_TIME" not in str(e.value)


@pytest.mark.parametrize("raw,want", [("1", True), ("", True), (" On ", True), ("TRUE", True),
                                      ("0", False), ("off", False), ("No", False)])
def test_tf_overlap_spellings(raw, want):
    assert settings_check.tf_overlap_enabled({"GRADFLOW_TF_OVERLAP": raw}) is want
    assert settings_check.tf_overlap_enabled({}) is True


def _run(code: str, env=None, timeout: float = 240) -> subprocess.CompletedProcess:
    e = rank_env()
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=run_cwd())


def test_init_rejects_bad_tf_overlap():
    # Before: accepted here, an error only when a tf.function step was traced.
    p = _run("import gradflow as gf\n"
             "try:\n    gf.init()\n    print('ACCEPTED')\n"
             "except gf.GradflowError as e:\n"
             "    print('REJECTED', type(e).__name__, isinstance(e, ValueError), e)\n",
             {"GRADFLOW_TF_OVERLAP": "7"}, timeout=60)
    out = p.stdout
    assert "REJECTED GradflowValueError True gradflow: invalid value '7' for GRADFLOW_TF_OVERLAP" \
        in out, out + p.stderr
    assert "Accepted: 1 | 0" in out, out


FRAMEWORKS = r"""
import math, tensorflow as tf, keras
import gradflow.tensorflow as htf, gradflow.keras as hk
from gradflow.lightning import GradflowStrategy
htf.init()

def expect(name, fragment, fn):
    try:
        fn()
        print("ACCEPTED", name, flush=True)
    except ValueError as e:
        print("REJECTED" if fragment in str(e) else "OTHER", name, "|", e, flush=True)

expect("tape", "sparse_ratio=1e-09", lambda: htf.DistributedGradientTape(tf.GradientTape(), sparse_ratio=1e-9))
expect("tape bool", "sparse_ratio=True", lambda: htf.DistributedGradientTape(tf.GradientTape(), sparse_ratio=True))
expect("keras", "sparse_ratio=1e-09", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sparse_ratio=1e-9))
expect("keras str", "sparse_ratio='0.5'", lambda: hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sparse_ratio="0.5"))
opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sparse_ratio=0.5)
expect("keras setter", "sparse_ratio=1e-09", lambda: setattr(opt, "sparse_ratio", 1e-9))
expect("warmup callback", "sparse_ratio=1e-09", lambda: hk.SparseWarmupCallback(1, 1e-9))
expect("tf allreduce", "sparse_ratio=1e-09", lambda: htf.allreduce(tf.ones(2), sparse_ratio=1e-9))
expect("tf grouped", "sparse_ratio=1e-09", lambda: htf.grouped_allreduce([tf.ones(2)], sparse_ratio=1e-9))
expect("lightning bucket", "bucket_mb=0.001", lambda: GradflowStrategy(bucket_mb=0.001))
expect("lightning ratio", "sparse_ratio=1e-09", lambda: GradflowStrategy(sparse_ratio=1e-9))
expect("tape ok", "", lambda: htf.DistributedGradientTape(tf.GradientTape(), sparse_ratio=1e-6))
print("DONE", flush=True)
"""


def test_tensorflow_keras_lightning_keywords():
    pytest.importorskip("tensorflow")
    pytest.importorskip("lightning")
    p = _run(FRAMEWORKS)
    lines = [ln for ln in p.stdout.splitlines() if ln.split(" ")[0] in
             ("ACCEPTED", "REJECTED", "OTHER")]
    assert "DONE" in p.stdout, p.stdout + p.stderr[-3000:]
    assert lines[-1] == "ACCEPTED tape ok", p.stdout
    assert all(ln.startswith("REJECTED") for ln in lines[:-1]), p.stdout
    assert len(lines) == 11, p.stdout
