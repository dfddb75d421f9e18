"""Bad input raises on every rank; dead ranks make the others raise."""
import os
import re
import sys
import time

import pytest

from _launch import HERE, gradflowrun, run_mpi

STALL = {"GRADFLOW_STALL_SHUTDOWN_TIME": "3", "GRADFLOW_STALL_CHECK_TIME": "1"}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_bad_input_raises_everywhere(n):
    out = run_mpi(n, "errors_script.py", env=STALL, timeout=120)
    assert f"errors OK on {n} ranks" in out.stdout
    if n > 1:
        assert "missing on ranks" in out.stderr  # the stall warning names the ranks


def check_survivors(out, survivors, low, high, tracebacks=0):
    """Each survivor printed its error after `low`..`high` s and then left
    through gradflow's orderly fatal exit (a crash after printing fails)."""
    for r in survivors:
        # Not anchored: mpiexec may join two ranks' lines (no per-line prefix here).
        m = re.search(rf"rank {r} raised after ([\d.]+) s", out.stdout)
        assert m, out.stdout
        assert low <= float(m.group(1)) < high, (r, m.group(0))
        assert (f"[gradflow rank {r}] communication failed or aborted; exiting with code 1"
                in out.stderr), out.stderr[-3000:]
    assert out.stderr.count("Traceback") == tracebacks, out.stderr[-3000:]
    assert "Segmentation" not in out.stderr and "BAD TERMINATION" not in out.stdout


# Plain mpiexec (no gradflowrun to report the death): survivors wait
# GRADFLOW_TIMEOUT, then raise.
@pytest.mark.parametrize("exit_code", [0, 3])
def test_dead_rank_makes_others_raise(exit_code):
    t0 = time.time()
    out = run_mpi(3, "dead_rank_script.py", str(exit_code), env={"GRADFLOW_TIMEOUT": "5"},
                  timeout=120, expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    elapsed = time.time() - t0
    check_survivors(out, (0, 2), 4.0, 20.0)
    assert out.stdout.count("timed out after 5 s") == 2, out.stdout
    assert elapsed < 60


def test_exception_on_one_rank_aborts_the_others():
    out = run_mpi(3, "raising_rank_script.py", env={"GRADFLOW_TIMEOUT": "30"}, timeout=120,
                  expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    check_survivors(out, (0, 2), 0.0, 10.0, tracebacks=1)  # rank 1's own
    assert out.stdout.count("rank 1 failed: ValueError: boom on rank 1") == 2, out.stdout
    assert "ValueError: boom on rank 1" in out.stderr  # rank 1's own traceback


@pytest.mark.parametrize("n", [2, 3])
def test_every_wait_is_bounded(n):
    # Default stall settings: only GRADFLOW_TIMEOUT may end a wait that
    # cannot complete; a busy rank must not trip it.
    out = run_mpi(n, "bounded_wait_script.py", "6", env={"GRADFLOW_TIMEOUT": "6"}, timeout=180)
    assert f"bounded waits OK on {n} ranks" in out.stdout


@pytest.mark.parametrize("n,launch", [(2, "mpiexec"), (3, "mpiexec"), (3, "gradflowrun")])
def test_different_step_tags_abort_at_once(n, launch):
    """One rank submits a cached name under another step tag (native Note
    [Step tags]); default GRADFLOW_TIMEOUT: every rank fails within seconds
    with both tags, then the job ends non-zero. mpiexec -disable-auto-cleanup:
    the first rank to leave (gradflow's fatal exit, code 1) must not get the
    slower ranks killed before they print (seen in CI at 3 ranks). Under
    gradflowrun no rank is blamed: every rank failed on the one agreed error."""
    if launch == "mpiexec":
        out = run_mpi(n, "step_tag_script.py", timeout=120, expect_fail=True,
                      mpi_args=("-disable-auto-cleanup",))
    else:
        out = gradflowrun("-np", str(n), sys.executable, os.path.join(HERE, "step_tag_script.py"))
        assert out.returncode == 1, out.stdout + out.stderr[-3000:]
        assert (f"gradflowrun: rank(s) {', '.join(map(str, range(n)))} failed on one job-wide "
                "error" in out.stderr), out.stderr[-3000:]
        assert "failed first" not in out.stderr, out.stderr[-3000:]
    assert out.stdout.count("step tags OK") == n, out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("variant", ["hyper", "both"])
def test_step_tags_of_two_checks_name_the_first_that_differs(variant):
    """A traced Keras step's tag joins its gradient list and (every 16th
    round) its hyperparameters with " & ": the message names the first part
    that differs (gradient list before hyperparameters), 3 ranks."""
    out = run_mpi(3, "step_tag_script.py", variant, timeout=120, expect_fail=True,
                  mpi_args=("-disable-auto-cleanup",))
    assert out.stdout.count("step tags OK") == 3, out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("n,framework,op,layout", [
    (2, "torch", "allreduce", "last-longer"),
    (3, "torch", "allreduce", "first-longer"),
    (3, "torch", "allreduce_async", "one-vs-four"),
    (4, "torch", "allreduce", "one-vs-four"),
    (3, "torch", "allreduce", "list-vs-single"),
    (2, "torch", "allgather", "first-longer"),
    (3, "torch", "reducescatter", "last-longer"),
    (3, "tf", "allreduce", "last-longer"),
    (2, "tf", "traced", "first-longer"),
    (3, "tf", "allgather", "one-vs-four"),
    (2, "tf", "reducescatter", "last-longer"),
    (3, "tf", "broadcast_", "first-longer"),
    (2, "torch", "allreduce", "empty-on-one"),
    (3, "torch", "allgather", "empty-on-one"),
    (4, "torch", "reducescatter", "empty-on-one"),
    (3, "tf", "allreduce", "empty-on-one"),
    (2, "tf", "traced", "empty-on-one"),
    (3, "tf", "broadcast_", "empty-on-one"),
])
def test_grouped_lists_of_different_lengths_abort_at_once(n, framework, op, layout):
    """A grouped op whose list is longer on some ranks (native Note [Grouped
    lists]); default GRADFLOW_TIMEOUT: every rank raises within seconds with
    both lengths, after two good calls under the same names (values checked
    against numpy), and the runtime then refuses the next collective. Before,
    the common tensors were reduced and the extra ones waited 60 s; an empty
    list on one rank (empty-on-one) submitted nothing and the others waited
    60 s. Every layout first passes an empty list on every rank (nothing
    happens)."""
    pytest.importorskip("tensorflow" if framework == "tf" else "torch")
    out = run_mpi(n, "grouped_lists_script.py", framework, op, layout, timeout=150,
                  expect_fail=True, mpi_args=("-disable-auto-cleanup",))
    assert out.stdout.count("grouped lists OK") == n, out.stdout + out.stderr[-3000:]
    assert "Segmentation" not in out.stderr + out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("n", [2, 3])
def test_handle_corners(n):
    """Default settings: a grouped op that fails on this rank before
    submission submits none of its members (input untouched, a retry under
    the same name equals numpy); poll() while another thread waits never
    raises; Ctrl-C ends a wait within a second and a second wait() returns
    the result; (3 ranks) a removed process set's completed handle keeps its
    result and a pending one says the set was removed; a handle left pending
    by shutdown() says so when waited, after it and after a new init()."""
    pytest.importorskip("torch")
    out = run_mpi(n, "handle_corners_script.py", timeout=120)
    assert out.stdout.count("handle corners OK") == n, out.stdout


@pytest.mark.parametrize("n,framework", [(2, "numpy"), (3, "numpy"), (4, "numpy"), (2, "torch"),
                                         (3, "torch"), (2, "tensorflow"), (3, "tensorflow")])
def test_a_call_that_fails_before_submission_fails_everywhere(n, framework):
    """Native Note [Withdrawn names]: one rank's call fails before it reaches
    the core (a user Compressor, an input only it refuses, a grouped op's
    member; named, unnamed, cached, in a process set, peers not there yet):
    the others raise its error at once, not after GRADFLOW_TIMEOUT (60 s
    here, the default), and the next calls pair with each other, never with
    the failed call's data (checked against numpy on every rank). An
    argument bad on one rank alone (op, sparse_ratio, compression, root)
    too: Note [Checks after naming] in gradflow/_withdrawal.py, torch's
    differentiable reducescatter and grouped forms included, and
    TensorFlow's ops eagerly and inside tf.function (the graph fails at
    the bad op on every rank, at run time); and a name submitted twice,
    refused on the ranks where the first call was still in flight (native
    Note [Withdrawing a name in flight])."""
    if framework != "numpy":
        pytest.importorskip(framework)
    out = run_mpi(n, "withdrawn_names_script.py", env={"FRAMEWORK": framework}, timeout=300)
    cases = ["named", "unnamed", "cached", "late", "refused", "set", "bad_argument", "duplicate"]
    if framework == "torch":
        cases.append("grouped")
    if framework == "tensorflow":
        cases = ["named", "unnamed", "cached", "late", "bad_argument"]
    for case in cases:
        assert out.stdout.count(f"OK {case} ") == n, out.stdout


FAILED_STEP_CASES = ["copy", "copy_all", "refused", "overlap_off", "groups", "pool", "pool_all",
                     "pool_step1", "bpps2_pool", "bpps2_copy", "fp16_pool", "csc_pool",
                     "csc_copy", "csc_groups", "user_raises_pool", "user_raises_copy"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_failed_optimizer_step_fails_everywhere_and_training_goes_on(n):
    """Note [A failed step] (gradflow/torch/optimizer_step.py): a torch
    DistributedOptimizer step whose reduction raises on one rank (or on all:
    a user Compressor, an input the core refuses, a pool range the core
    refuses, a step-1 submission; copy path, overlap=False, groups=, pool,
    backward_passes_per_step=2, fp16 wire, CSC on the pool, copy path and
    groups) raises on every rank within 10 s under the default
    GRADFLOW_TIMEOUT (60 s), and after zero_grad() the next steps equal a
    run that skipped that step (bit for bit; fp16 within its rounding),
    bitwise alike on every rank, and plain torch (fp32). No fusion and no
    bucket merging, so that two runs reduce in the same order bit for bit."""
    pytest.importorskip("torch")
    env = {"GRADFLOW_SPARSE_CHUNK": "64", "GRADFLOW_FUSION_THRESHOLD": "0",
           "GRADFLOW_POOL_MERGE": "0"}
    out = run_mpi(n, "torch_failed_step_script.py", env=env, timeout=400)
    for case in FAILED_STEP_CASES:
        assert out.stdout.count(f"OK {case}\n") == n, (case, out.stdout)
