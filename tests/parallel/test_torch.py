"""gradflow.torch under mpiexec: tensor collectives (1-3 ranks), DistributedOptimizer
training vs single-process training on pool and copy paths, awkward cases, and
errors that must raise on every rank. Each script bundles many checks because
importing torch + sklearn costs a few seconds per process on this machine."""
import importlib.util

import pytest

from _launch import run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")


def _oks(out, n):
    return [line for line in out.stdout.splitlines() if line.startswith("ok ") and f"(size {n})" in line]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_torch_ops(n):
    out = run_mpi(n, "torch_ops_script.py", timeout=150)
    assert len(_oks(out, n)) == 13, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_training_matches_single_process(n):
    args = ("--quick",) if n == 3 else ()
    out = run_mpi(n, "torch_train_script.py", *args, timeout=180)
    assert "ok pool path is zero-copy" in out.stdout and "ok copy path copies" in out.stdout, out.stdout
    assert len(_oks(out, n)) >= 11, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_awkward_cases(n):
    out = run_mpi(n, "torch_awkward_script.py", timeout=180)
    assert len(_oks(out, n)) == 16, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_sparse_gradients_unused_on_some_ranks(n):
    """nn.Embedding(sparse=True) unused on some ranks, or on all, in a step
    (step 1 included): the ranks agree once which parameters are sparse
    (Note [Sparse gradients agreed once]) on the pool, copy, overlap=False,
    bpps=2, groups= and process-set paths; sparse_as_dense with
    model.zero_grad(); groups= honours sparse_ratio (an explicit 1.0 over
    GRADFLOW_SPARSE_RATIO, which the whole run sets)."""
    out = run_mpi(n, "torch_sparse_unused_script.py", timeout=180,
                  env={"GRADFLOW_SPARSE_RATIO": "0.5", "GRADFLOW_SPARSE_CHUNK": "4",
                       "GRADFLOW_SPARSE_WARMUP_STEPS": "0"})
    assert len(_oks(out, n)) == 23, out.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_optimizer_parameter_kinds(n):
    """Complex64/complex128 parameters (reduced as view_as_real, Note [Complex
    gradients]; a lazily conjugated gradient among them), a tied weight, a
    non-contiguous parameter and a channels_last conv, on the pool, copy,
    groups, CSC, fp16-wire and accumulation paths: bitwise identical, equal to
    plain torch. Meta-device parameters and Adasum of a complex one raise
    ValueError at construction (before: TypeError inside the first backward);
    broadcast_parameters / broadcast_optimizer_state carry complex tensors."""
    out = run_mpi(n, "torch_param_kinds_script.py", timeout=240)
    assert len(_oks(out, n)) == 10, out.stdout


@pytest.mark.parametrize("n", [1, 2, 3])
def test_torch_late_parameters_are_reduced(n):
    """Unfrozen after wrapping, or added by add_param_group: reduced like the
    rest on every optimizer path (Note [Late parameters]); frozen after
    wrapping: stays put (Note [Frozen after wrapping])."""
    out = run_mpi(n, "torch_late_params_script.py", timeout=240)
    assert len(_oks(out, n)) == 42 + (n > 1), out.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_grad_touched_before_step(n):
    """clip_grad_norm_, GradScaler.step and reads between backward and step
    without synchronize(): reduced when backward returns (Note [Reduced when
    backward returns]); CSC + GradScaler + model.zero_grad() recovers from an
    overflow."""
    out = run_mpi(n, "torch_grad_before_step_script.py", timeout=240)
    assert len(_oks(out, n)) == 44, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_errors_raise_on_every_rank(n):
    out = run_mpi(n, "torch_errors_script.py", timeout=150)
    assert len(_oks(out, n)) == 10, out.stdout


def test_torch_pool_buckets_never_fused():
    run_mpi(2, "torch_train_script.py", "--buckets-zero-copy", timeout=120)


@pytest.mark.parametrize("merge", ["1", "0"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_torch_pool_merge_matches_numpy(n, merge):
    # issue 16 target 5: tiny pool buckets, several ready per cycle; merged
    # (GRADFLOW_POOL_MERGE=1) or one collective per bucket, the reduced
    # gradients equal the numpy mean and are bitwise identical on every rank.
    out = run_mpi(n, "torch_pool_merge_script.py",
                  env={"GRADFLOW_POOL_MERGE": merge, "GRADFLOW_SPARSE_CHUNK": "64",
                       "GRADFLOW_SPARSE_WARMUP_STEPS": "2"}, timeout=300)
    assert len(_oks(out, n)) == 5, out.stdout
    merged = [int(line.split()[2]) for line in out.stdout.splitlines()
              if line.startswith("merged collectives:")]
    assert len(merged) == 1, out.stdout
    # ~6 buckets per step over 25 pool steps: with merging on, some cycle
    # must have found adjacent buckets ready together.
    assert (merged[0] > 0) == (merge == "1"), out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_pool_first_bucket_cap_matches_numpy(n):
    # GRADFLOW_POOL_FIRST_BUCKET_BYTES (off by default): a 64-byte cap makes
    # the first bucket hold only the first gradient; the same numpy checks
    # (every rank bitwise equal, fp16, unused parameter, bpps=2, CSC) hold.
    buckets = {}
    for cap in ("0", "64"):
        out = run_mpi(n, "torch_pool_merge_script.py",
                      env={"GRADFLOW_POOL_FIRST_BUCKET_BYTES": cap, "GRADFLOW_POOL_MERGE": "0",
                           "GRADFLOW_SPARSE_CHUNK": "64", "GRADFLOW_SPARSE_WARMUP_STEPS": "2"},
                      timeout=300)
        assert len(_oks(out, n)) == 5, out.stdout
        buckets[cap] = [int(line.split()[2]) for line in out.stdout.splitlines()
                        if line.startswith("pool buckets:")]
    # The cap really cut the first bucket apart: more buckets, same steps.
    assert len(buckets["0"]) == 1 and buckets["64"][0] > buckets["0"][0], buckets


@pytest.mark.parametrize("n,algo", [(2, "ring"), (3, "ring"), (3, "halving-doubling"),
                                    (4, "halving-doubling")])
def test_torch_csc_matches_numpy_model(n, algo):
    # Small chunks so a 2,410-parameter MLP has ~40 of them; no warm-up
    # beyond the dense step 1, so every later step is sparse. Halving-doubling
    # (its fold at 3 ranks) carries the importance and chunk allreduces too.
    out = run_mpi(n, "torch_csc_script.py", env={"GRADFLOW_SPARSE_CHUNK": "64",
                                                 "GRADFLOW_SPARSE_WARMUP_STEPS": "0",
                                                 "GRADFLOW_ALLREDUCE_ALGO": algo}, timeout=240)
    assert len(_oks(out, n)) == 6, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_matches_simulated_ranks(n):
    # unused parameters (pool/copy x every zero_grad flavour), autocast +
    # GradScaler with an overflow, broadcast_optimizer_state then training
    out = run_mpi(n, "torch_reference_script.py", timeout=180)
    assert len(_oks(out, n)) == 9, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_horovod_parity(n):
    # issue 14: set_backward_passes_per_step, broadcast_optimizer_state(model=),
    # grouped_allgather / grouped_reducescatter, reducescatter pre/postscale,
    # broadcast_parameters(model.parameters())
    out = run_mpi(n, "torch_hvd_parity_script.py", timeout=180)
    assert len(_oks(out, n)) == 12, out.stdout


def test_torch_one_rank_is_plain_torch():
    # issue 16: with one rank every mode (pool, copy, 16-bit wire, CSC, groups,
    # Adasum, accumulation) is plain torch bit for bit and sends nothing
    out = run_mpi(1, "torch_one_rank_script.py", timeout=150)
    assert len(_oks(out, 1)) == 4, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_broadcast_optimizer_state_initialises_as_horovod(n):
    # Horovod's torch suite (test_broadcast_state_no_grad): a fresh optimizer
    # gets one local step on zero gradients before its state is broadcast;
    # unlike Horovod, never where it would leave the ranks' weights different
    out = run_mpi(n, "torch_optimizer_init_script.py", timeout=180)
    assert len(_oks(out, n)) == 6, out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_torch_optimizer_hyperparameters_agreeing_raise_nothing(n):
    # gradflow/torch/hyperparameter_check.py: equal rates (schedules on every
    # path, averaged metrics, own keys, join(), a late broadcast) pass
    out = run_mpi(n, "torch_hyperparameter_script.py", "equal", timeout=240)
    assert len(_oks(out, n)) == 7, out.stdout


@pytest.mark.parametrize("n,case", [(2, "plateau-pool"), (3, "plateau-pool"),
                                    (3, "transient-copy"), (2, "transient-groups"),
                                    (2, "transient-csc"), (2, "passes-pool"),
                                    (3, "passes-copy"), (2, "passes-groups"),
                                    (3, "frozen-pool"), (2, "steps-copy"),
                                    (2, "amp-pool"), (3, "ampseen-copy")])
def test_torch_optimizer_hyperparameters_differing_between_ranks_fail_the_job(n, case):
    # Rank-local learning rates (ReduceLROnPlateau on each rank's own loss, or
    # one step's rate on one rank) fail the job on every rank through the
    # step tag of every 16th round (native Note [Step tags]); default timeouts.
    # passes-*: backward_passes_per_step set on the last rank only (it ran
    # silently before, each reduction averaging 1 pass with the sum of 2)
    # frozen-pool: a layer frozen after wrapping on the last rank only (its
    # copy stayed put while the others moved theirs, silently); steps-copy: one
    # backward pass more on the last rank before a step() (rounds paired
    # with the others' next step's: weights apart, a stall at the end);
    # amp-pool / ampseen-copy: a GradScaler resumed with another scale on the
    # last rank, given as grad_scaler= or not (weights apart silently before)
    out = run_mpi(n, "torch_hyperparameter_script.py", case, timeout=180, expect_fail=True,
                  mpi_args=("-disable-auto-cleanup",))
    for r in range(n):
        assert f"path raised on rank {r} of {n}" in out.stdout, out.stdout + out.stderr[-3000:]


@pytest.mark.parametrize("n", [2, 3])
def test_torch_alltoall_argument_errors_as_horovod(n):
    # Horovod's torch suite (test_horovod_alltoall_*_error): ValueError at submit
    out = run_mpi(n, "torch_alltoall_args_script.py", timeout=120)
    assert len(_oks(out, n)) == 2, out.stdout


_CSC_ENV = {"GRADFLOW_SPARSE_CHUNK": "64", "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}


@pytest.mark.parametrize("n,script,oks,env", [
    *[(n, "torch_awkward_script.py", 16, {}) for n in (2, 3, 4)],
    *[(n, "torch_csc_script.py", 6, _CSC_ENV) for n in (2, 3, 4)],
    *[(n, "torch_train_script.py", 11, {}) for n in (2, 3)]])
def test_torch_fused_linear_combinations(n, script, oks, env):
    # Every Linear is a FusedLinear (weight gradients accumulated in place into
    # the pool views): the awkward cases (accumulation, unused heads, tied
    # weights, model.zero_grad(), autocast + GradScaler), CSC with the residual
    # in the pool against the numpy model, and training against single-process
    # torch must all hold as with nn.Linear, ranks bitwise identical.
    out = run_mpi(n, script, env={"GRADFLOW_TEST_FUSED_LINEAR": "1", **env}, timeout=300)
    assert len(_oks(out, n)) >= oks, out.stdout
