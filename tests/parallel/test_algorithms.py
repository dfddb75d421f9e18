"""Which allreduce algorithm runs and what it computes: the auto table and
explicit choices checked through stats() on every rank, the 16-bit wire's
rounding bit for bit against a numpy model (ring, two-sync, mpi, recursive-
and halving-doubling), halving-doubling's native sums, averages, min, max and
product bit for bit against its model, and the
two-sync and mpi algorithms under DistributedOptimizer training and on
sub-communicators. Faults and re-init with two-sync: test_faults.py;
several hosts: test_multihost.py."""
import importlib.util
import re
import time

import pytest

from _launch import run_mpi


@pytest.mark.parametrize("algo,n", [("auto", 2), ("auto", 3), ("auto", 4), ("ring", 2),
                                    ("two-sync", 3), ("mpi", 2), ("mpi", 3),
                                    ("recursive-doubling", 3), ("recursive-doubling", 4),
                                    ("halving-doubling", 3), ("halving-doubling", 4)])
def test_algorithm_that_ran(algo, n):
    out = run_mpi(n, "algo_choice_script.py", env={"GRADFLOW_ALLREDUCE_ALGO": algo}, timeout=120)
    assert f"algo choice OK on {n} ranks with {algo}" in out.stdout, out.stdout


@pytest.mark.parametrize("settings,n", [
    (["ring,two-sync"], 2), (["auto,auto,ring"], 3), (["mpi,ring"], 3),
    # Two settings whose concatenated digits read the same ("1000"+"50" vs
    # "10005"+"0"): the configuration check must still see them differ.
    (["GRADFLOW_SPARSE_CHUNK=1000,10005", "GRADFLOW_SPARSE_WARMUP_STEPS=50,0"], 2),
    (["GRADFLOW_SPARSE_RATIO=0.000001,0.0000014"], 2)])
def test_settings_differ_between_ranks(settings, n):
    out = run_mpi(n, "algo_mismatch_script.py", *settings, timeout=120)
    # Ranks' lines may interleave in the shared stdout: find them anywhere.
    assert sorted(int(r) for r in re.findall(r"rank (\d+) refused", out.stdout)) == list(range(n)), out.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_invalid_setting_on_one_rank_fails_every_rank_at_once(n):
    # Default GRADFLOW_TIMEOUT (60 s): the other ranks used to wait it out in
    # init() and blame no one; now every rank names rank 1's setting at once.
    t0 = time.time()
    out = run_mpi(n, "algo_mismatch_script.py", "GRADFLOW_CYCLE_TIME=1,abc", timeout=120)
    assert time.time() - t0 < 30, out.stdout
    # Ranks' lines may be glued together in the shared stdout: each message
    # ends with "not per rank".
    lines = re.findall(r"rank (\d+) refused: (.*?not per rank)", out.stdout, re.S)
    assert sorted(int(r) for r, _ in lines) == list(range(n)), out.stdout
    for _, msg in lines:
        assert "settings are invalid on some ranks; rank 1: gradflow: invalid value 'abc' for " \
               "GRADFLOW_CYCLE_TIME" in msg, msg


@pytest.mark.parametrize("algo", ["ring", "two-sync", "mpi", "recursive-doubling", "halving-doubling"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_wire_rounding_matches_model(n, algo):
    # 64 KiB pieces: the ring's pipeline splits segments, which must not change a bit.
    env = {"GRADFLOW_ALLREDUCE_ALGO": algo, "GRADFLOW_RING_PIPELINE_BYTES": "65536"}
    out = run_mpi(n, "wire_rounding_script.py", env=env, timeout=180)
    assert f"wire rounding OK on {n} ranks with {algo}" in out.stdout, out.stdout


@pytest.mark.parametrize("algo", ["ring", "two-sync", "recursive-doubling", "halving-doubling"])
def test_wire_rounding_scalar_codec(algo):
    env = {"GRADFLOW_ALLREDUCE_ALGO": algo, "WIRE_TEST_SCALAR_CODEC": "1"}
    out = run_mpi(3, "wire_rounding_script.py", env=env, timeout=180)
    assert f"wire rounding OK on 3 ranks with {algo}" in out.stdout, out.stdout


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_halving_doubling_matches_model(n):
    # Bit for bit against tests/parallel/_hd_model.py: float32/64/16 sums and
    # averages, int32 sum/min/max/product, bool min/max; 64 KiB pieces, so
    # the larger sizes arrive in several.
    env = {"GRADFLOW_ALLREDUCE_ALGO": "halving-doubling", "GRADFLOW_RING_PIPELINE_BYTES": "65536"}
    out = run_mpi(n, "halving_doubling_script.py", env=env, timeout=240)
    assert f"halving-doubling OK on {n} ranks" in out.stdout, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("algo,n", [("two-sync", 2), ("two-sync", 3), ("mpi", 3),
                                    ("recursive-doubling", 3), ("recursive-doubling", 4)])
def test_training_matches_single_process(algo, n):
    out = run_mpi(n, "algo_train_script.py", env={"GRADFLOW_ALLREDUCE_ALGO": algo}, timeout=240)
    oks = [line for line in out.stdout.splitlines() if line.startswith(f"ok {algo} ")]
    assert len(oks) == (4 if algo == "mpi" else 6), out.stdout


@pytest.mark.parametrize("algo,n", [("two-sync", 3), ("two-sync", 4), ("mpi", 4),
                                    ("recursive-doubling", 4), ("halving-doubling", 4)])
def test_sub_communicator(algo, n):
    out = run_mpi(n, "subcomm_script.py", env={"GRADFLOW_ALLREDUCE_ALGO": algo}, timeout=120)
    assert out.stdout.count("subcomm OK") == n, out.stdout
