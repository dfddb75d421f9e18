"""TensorFlow/Keras on one rank costs nothing (issue 16 target 2,
gradflow/one_rank.py): at N = 1 every DistributedOptimizer /
DistributedGradientTape mode trains bit for bit like plain Keras / TF and
sends nothing through the core (also Keras on the torch backend); in a 2-4
rank job a one-member process set takes that path while the other set still
reduces, against numpy."""
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest

from _launch import (HERE, change_hosts_after_first_step, host_discovery, rank_env, run_cwd, run_mpi,
                     skip_unless_hydra)

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="tensorflow is not installed")


def test_tf_keras_one_rank_is_plain_keras():
    # Small CSC chunks: through the core, sparse_ratio=0.01 would keep most of
    # these small gradients in the residual, so a lost fast path shows.
    out = run_mpi(1, "tf_one_rank_script.py", env={**TF_ENV, "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=400)
    assert out.stdout.count("tf one rank OK") == 6, out.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_one_member_process_set_takes_the_one_rank_path(n):
    # the last rank alone in a set, the others together (one at n = 2)
    out = run_mpi(n, "tf_one_rank_sets_script.py", env={**TF_ENV, "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=400)
    assert f"tf one rank sets OK on {n} ranks" in out.stdout, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_keras_torch_backend_one_rank_is_plain_keras():
    out = run_mpi(1, "keras_torch_one_rank_script.py",
                  env={**TF_ENV, "KERAS_BACKEND": "torch", "GRADFLOW_SPARSE_CHUNK": "4"},
                  timeout=240)
    assert "keras torch one rank OK" in out.stdout, out.stdout


@skip_unless_hydra("elastic workers are started with the mpich wheel's mpiexec")
def test_elastic_keras_grows_from_one_worker(tmp_path):
    """model.fit's train function is traced while the world has one worker
    and kept when a second one joins (gradflow/keras/elastic.py): in elastic
    mode the traced step must not bake in the one-rank path, or the two
    workers would stop reducing together. Both end with the same weights."""
    hosts, script = host_discovery(tmp_path, "localhost:1\n")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = rank_env()
    env.update(ELASTIC_EPOCHS="2", ELASTIC_LOG=str(log_dir), ELASTIC_STEP_SLEEP="0.05",
               ELASTIC_WAIT="2:1", GRADFLOW_TIMEOUT="60")
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "--min-np", "1", "--max-np", "2",
           "--start-timeout", "150", "--host-discovery-script", str(script),
           sys.executable, os.path.join(HERE, "elastic_keras_script.py")]
    # Own session, and SIGINT first: a hung job (what a baked-in one-rank path
    # gives) is ended whole; the elastic driver kills its workers (each in a
    # session of its own) on KeyboardInterrupt.
    p = subprocess.Popen(cmd, env=env, cwd=run_cwd(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # after the one worker has traced and run its train function
        change_hosts_after_first_step(p, log_dir, hosts, "localhost:2\n", wait_s=200)
        out, _ = p.communicate(timeout=400)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of a failed run, if any
        except ProcessLookupError:
            pass
    assert p.returncode == 0, out[-6000:]
    assert "generation 1: 2 worker(s)" in out, out[-6000:]
    results = {}
    for path in log_dir.iterdir():
        with open(path) as f:
            events = [json.loads(line) for line in f]
        results.update({path.stem: e for e in events if e["event"] == "result"})
    assert sorted(results) == ["worker-0", "worker-1"], out[-6000:]
    assert {r["size"] for r in results.values()} == {2}, results
    assert len({r["hash"] for r in results.values()}) == 1, results
