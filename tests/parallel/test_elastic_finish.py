"""gradflowrun's elastic mode when a worker's program ends while the others
still train (tests/parallel/elastic_early_finish_script.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from _launch import rank_env, run_cwd, skip_unless_hydra

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = skip_unless_hydra("elastic mode starts each worker with MPICH's mpiexec")


def test_a_worker_ending_early_while_the_others_train_fails_the_job():
    """Rank 1 of 3 returns from the elastic function after 5 of 40 steps; the
    others' next allreduce fails at once. Its exit hook tells the driver that
    training finished before it shuts gradflow down (worker.py finished()),
    so their failures count as failures after the finish: exit 1, saying so.
    Before, their exits reached the driver before rank 1's (it was still in
    MPI_Finalize), counted as failures during training, then rank 1's exit 0
    as the end of training: gradflowrun exited 0 with 2 of 3 workers failed
    (3 of 3 runs)."""
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "--start-timeout", "60",
           "--min-np", "1", "-np", "3", "--max-np", "3", sys.executable,
           os.path.join(HERE, "elastic_early_finish_script.py")]
    r = subprocess.run(cmd, env=rank_env(), cwd=run_cwd(), capture_output=True, text=True,
                       timeout=120)
    out = r.stdout + r.stderr
    assert "rank 1: ended early" in out, out
    assert r.returncode == 1, out
    assert "training finished, but rank" in out and "exited with code 1 afterwards" in out, out
