"""gradflow.tensorflow and gradflow.keras on 2 ranks (TF import is ~5-10 s per
process, so each script combines many checks): ops eager and in tf.function
with gradients, DistributedGradientTape, Keras fit vs single-process training,
every callback, mismatch errors, and one runtime shared with gradflow.torch."""
import importlib.util
import os

import pytest

from _launch import ROOT, run_mpi

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed")


def test_tf_ops_eager_graph_gradients_tape():
    out = run_mpi(2, "tf_ops_script.py", env=TF_ENV, timeout=240)
    assert out.stdout.count("tf ops OK") == 2, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_tf_horovod_api(ranks):
    """Horovod 0.28's horovod.tensorflow additions: reducescatter pre/postscale,
    grouped allgather/reducescatter, alltoall, broadcast_, join, objects,
    broadcast_global_variables, (Partial)DistributedGradientTape; Keras
    float8 through the tape: amax Max-reduced (before: averaged)."""
    out = run_mpi(ranks, "tf_hvd_api_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("tf hvd api OK") == ranks, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_tf_default_named_tapes_keep_their_own_residuals(ranks):
    """Two default-named DistributedGradientTapes over different variables
    with sparse_ratio: separate CSC residuals (Note [Default tape names]),
    eagerly and in tf.function; equal to explicitly named tapes. Keras
    fine-tuning with CSC (a layer frozen between fits, then unfrozen): each
    gradient keeps its variable's name and residual (before: layer 0's unsent
    gradient went into layer 1's, 0.039 off)."""
    env = dict(TF_ENV, GRADFLOW_SPARSE_CHUNK="16", GRADFLOW_SPARSE_WARMUP_STEPS="0")
    out = run_mpi(ranks, "tf_tape_names_script.py", env=env, timeout=240)
    assert out.stdout.count("tf tape names OK") == ranks, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_keras_horovod_functions(ranks):
    """horovod.tensorflow.keras's value collectives, load_model round trip and
    PartialDistributedOptimizer; MetricAverageCallback over the process set
    of the model's DistributedOptimizer (before: all ranks, the sets'
    metrics mixed)."""
    out = run_mpi(ranks, "keras_hvd_api_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("keras hvd api OK") == ranks, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_keras_load_model_keeps_backward_passes_per_step(ranks):
    """A model saved with DistributedOptimizer(backward_passes_per_step=k)
    comes back from gradflow.keras.load_model with k (Horovod's sum, reduced
    once per k) and its state: it trains on as the never-saved model and as
    a single-process reference (Note [Saved accumulation]). A broadcast of
    the optimizer's variables in the middle of a k-batch step (KerasState.sync,
    BroadcastGlobalVariablesCallback) keeps each rank's accumulators (Note
    [Accumulators stay local])."""
    out = run_mpi(ranks, "keras_saved_accumulation_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("keras saved accumulation OK") == ranks, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_keras_epoch_agreement(ranks):
    """EpochAgreementCallback: uneven batch counts and a stop on one rank only
    raise GradflowError on every rank within seconds (not after
    GRADFLOW_TIMEOUT); uneven_batches="sync" goes on as under join() (ranks
    identical, numbers vs a reference); no effect when the ranks agree."""
    env = dict(TF_ENV, GRADFLOW_TIMEOUT="60")  # the default: the script checks < 30 s
    out = run_mpi(ranks, "keras_epoch_agreement_script.py", env=env, timeout=300)
    assert out.stdout.count("keras epoch agreement OK") == ranks, out.stdout


def test_keras_fit_and_callbacks():
    out = run_mpi(2, "keras_fit_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("keras OK") == 2, out.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_keras_horovod_parity(ranks):
    """gradflow.tensorflow.keras as Horovod 0.28's horovod.tensorflow.keras:
    signatures, backward_passes_per_step sum/average, callbacks' arguments;
    Keras 3's MultiOptimizer wrapped (before: AttributeError at the first
    step) or wrapping DistributedOptimizers, against the plain one."""
    out = run_mpi(ranks, "keras_horovod_script.py", env=TF_ENV, timeout=300)
    assert out.stdout.count("keras horovod OK") == ranks, out.stdout


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "gradflow", "torch", "__init__.py"))
                    or importlib.util.find_spec("torch") is None,
                    reason="gradflow.torch (or torch) is not available")
def test_torch_and_tensorflow_share_one_runtime():
    out = run_mpi(2, "tf_torch_script.py", env=TF_ENV, timeout=240)
    assert out.stdout.count("one runtime OK") == 2, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_keras_torch_backend():
    """Keras on the torch backend: fit with the callbacks against plain Keras;
    fine-tuning with CSC (names by variable index); a 0-d weight (before: a
    RuntimeError, the reduced gradient came back as shape [1])."""
    env = {**TF_ENV, "KERAS_BACKEND": "torch", "GRADFLOW_SPARSE_CHUNK": "16",
           "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}  # the fine-tuning case's CSC
    out = run_mpi(2, "keras_torch_backend_script.py", env=env, timeout=240)
    assert out.stdout.count("keras torch backend OK") == 2, out.stdout


_KERAS_PATHS = ["traced", "nooverlap", "eager", "lso", "bpps2", "spe4",
                pytest.param("torch", marks=pytest.mark.skipif(
                    importlib.util.find_spec("torch") is None, reason="torch is not installed"))]


@pytest.mark.parametrize("path", _KERAS_PATHS)
@pytest.mark.parametrize("ranks", [2, 3])
def test_keras_optimizer_hyperparameters_agreeing_raise_nothing(ranks, path):
    """gradflow/keras/hyperparameter_check.py: a schedule and an averaged
    ReduceLROnPlateau moving the rate alike, rates equal only after the
    broadcast, and join() after uneven epochs raise nothing; weights bitwise
    identical."""
    out = run_mpi(ranks, "keras_hyperparameter_script.py", "equal", path, env=TF_ENV,
                  timeout=300)
    oks = 2 if path == "traced" else 1
    assert out.stdout.count("ok ") == oks * ranks, out.stdout


@pytest.mark.parametrize("path", _KERAS_PATHS)
@pytest.mark.parametrize("case,ranks", [("plateau", 2), ("transient", 3)])
def test_keras_optimizer_hyperparameters_differing_between_ranks_fail_the_job(case, ranks, path):
    """ReduceLROnPlateau on a rank-local metric (rank 0 lowers its rate), or
    one update with another rate on the last rank: every rank's fit raises
    GradflowError naming both ranks' rates (step tag of every 16th round,
    native Note [Step tags]); default timeouts. Before: silent drift."""
    out = run_mpi(ranks, "keras_hyperparameter_script.py", case, path, env=TF_ENV, timeout=300,
                  expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    for r in range(ranks):
        assert f"{case} on the {path} path raised on rank {r} of {ranks}" in out.stdout, \
            out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("case,ranks", [("tape", 3), ("keras", 2)])
def test_tf_tape_gradient_none_on_some_ranks(case, ranks):
    """A variable used on some ranks only: eagerly reduced with zeros from
    the others (numpy average), None where no rank uses it, the same with
    unconnected_gradients=ZERO ("tape"); a step traced differently per rank
    (a tf.function around the tape; Keras fit on TensorFlow) aborts the job
    on every rank within seconds with both step tags, default timeouts
    (before: a stall until GRADFLOW_TIMEOUT). 3 ranks: one rank without the
    gradient, two with it."""
    out = run_mpi(ranks, "tf_unconnected_script.py", case, env=TF_ENV, timeout=240,
                  expect_fail=True)
    if case == "tape":
        assert out.stdout.count("eager None on some ranks OK (default)") == 3, out.stdout
        assert out.stdout.count("eager None on some ranks OK (ZERO)") == 3, out.stdout
    assert out.stdout.count(f"traced None on some ranks, {case}: error OK") == ranks, \
        out.stdout + out.stderr[-3000:]


def test_tf_function_whose_trace_fails_on_one_rank():
    """A tf.function whose trace raises on rank 1 only (3 ranks; Note [A
    trace that fails on one rank], docs/tensorflow.md): uncaught, the others'
    run fails quoting rank 1's exception (excepthook abort, not the
    GRADFLOW_TIMEOUT stall); caught, with rank 1 going on to another
    collective, every rank gets the stall error at GRADFLOW_TIMEOUT (4 s
    here) and the runtime stays usable."""
    out = run_mpi(3, "tf_unconnected_script.py", "trace", env={**TF_ENV, "GRADFLOW_TIMEOUT": "4"},
                  timeout=240, expect_fail=True)
    # Every rank gets the stall error; the two ranks whose trace succeeded the abort.
    for what, ranks in (("caught: stall error OK", 3), ("uncaught: abort OK", 2)):
        assert out.stdout.count(f"trace failed on one rank, {what}") == ranks, \
            out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("backend,ranks", [("tensorflow", 2), ("tensorflow", 3), ("torch", 3)])
def test_keras_branch_on_some_ranks_and_unbuilt_model(backend, ranks):
    """A layer used on some ranks only (run eagerly), with and without
    accumulation and a LossScaleOptimizer: equal to a run with zero
    gradients there (before: gradients of different steps were paired up,
    max diff 0.17); an unbuilt model with BroadcastGlobalVariablesCallback
    (before, TensorFlow: "Unknown variable"): identical after the first batch."""
    out = run_mpi(ranks, "keras_none_branch_script.py",
                  env={**TF_ENV, "KERAS_BACKEND": backend}, timeout=300)
    assert out.stdout.count(f"ok None on some ranks, {backend},") == 3 * ranks, out.stdout
    assert out.stdout.count(f"ok unbuilt model broadcast after the first batch, {backend},") \
        == 2 * ranks, out.stdout


@pytest.mark.parametrize("backend,ranks", [("tensorflow", 2), ("tensorflow", 3), ("torch", 3)])
def test_keras_mixed_precision_overflow_on_one_rank(backend, ranks):
    """mixed_float16 (compile's own LossScaleOptimizer, or one around or
    inside gradflow's) with an fp16 overflow on the last rank only: every
    rank skips that batch (bitwise identical, one halving of the scale,
    equal to a run without that batch), with and without accumulation;
    default timeouts (before: a stall until GRADFLOW_TIMEOUT). float8
    (model.quantize): scales and amax histories Max-reduced, ranks identical
    (before: the ranks' mean, or with accumulation each rank its own); a
    PartialDistributedOptimizer's local layer keeps its own. CSC under a
    LossScaleOptimizer whose scale grows: bitwise the run without one (Note
    [Residuals in unscaled units]; before, 0.0251 off at 2 ranks)."""
    out = run_mpi(ranks, "keras_mixed_precision_script.py",
                  env={**TF_ENV, "KERAS_BACKEND": backend, "GRADFLOW_SPARSE_CHUNK": "16",
                       "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}, timeout=300)
    assert out.stdout.count(f"ok mixed_float16 overflow on one rank, {backend},") == 5, out.stdout
    assert "ok 16-bit wire + accumulation under a loss scaler refused" in out.stdout, out.stdout
    assert out.stdout.count(f"ok float8 scales Max-reduced, {backend},") == 2, out.stdout
    assert f"ok float8 state of a local layer stays local, {backend}" in out.stdout, out.stdout
    for mode in ("around", "inside"):
        assert f"ok CSC residuals unscaled, {backend}, {mode}" in out.stdout, out.stdout
