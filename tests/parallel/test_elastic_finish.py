"""gradflowrun's elastic mode when a worker's program ends while the others
still train (tests/parallel/elastic_early_finish_script.py), or ends of an
error every rank got (a stall: elastic_partial_commit_script.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from _launch import rank_env, run_cwd, skip_unless_hydra

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = skip_unless_hydra("elastic mode starts each worker with MPICH's mpiexec")


def _elastic_job(flags, script, **env_vars):
    """Run `script` (beside this file) under gradflowrun's elastic mode with
    `flags`; the exit code and stdout + stderr."""
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "--start-timeout", "60", *flags,
           sys.executable, os.path.join(HERE, script)]
    env = rank_env()
    env.update(env_vars)
    r = subprocess.run(cmd, env=env, cwd=run_cwd(), capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_a_worker_ending_early_while_the_others_train_fails_the_job():
    """Rank 1 of 3 returns from the elastic function after 5 of 40 steps; the
    others' next allreduce fails at once. Its exit hook tells the driver that
    training finished before it shuts gradflow down (worker.py finished()),
    so their failures count as failures after the finish: exit 1, saying so.
    Before, their exits reached the driver before rank 1's (it was still in
    MPI_Finalize), counted as failures during training, then rank 1's exit 0
    as the end of training: gradflowrun exited 0 with 2 of 3 workers failed
    (3 of 3 runs)."""
    code, out = _elastic_job(["--min-np", "1", "-np", "3", "--max-np", "3"],
                             "elastic_early_finish_script.py")
    assert "rank 1: ended early" in out, out
    assert code == 1, out
    assert "training finished, but rank" in out and "exited with code 1 afterwards" in out, out


def test_a_stall_ends_the_job_even_if_a_rank_hears_of_its_peer_exit_first():
    """Ranks calling state.commit() at different steps stall in the commit's
    collective: every rank raises the stall at GRADFLOW_TIMEOUT and the job
    ends, exit 1. Rank 1 pauses 3 s before its error reaches elastic.run
    (elastic_partial_commit_script.py), so the driver has told it of rank
    0's exit by then: it took the stall for a lost peer, rolled back and
    asked for a generation, and the driver, below --min-np 2 with its only
    host blacklisted, waited --elastic-timeout (600 s by default): a hang
    (seen once in 19 unpaused runs). Note [A stall is no lost peer] and Note
    [Below --min-np for good] (elastic_forming.py)."""
    code, out = _elastic_job(["--min-np", "2", "-np", "2"], "elastic_partial_commit_script.py",
                             GRADFLOW_TIMEOUT="4")
    assert code == 1, out
    for rank, name in ((0, "g2"), (1, "gradflow.elastic.host_updates")):
        assert f"rank {rank} raised: gradflow stall: '{name}' (allreduce)" in out, out
    assert "generation 1" not in out and "finished (unexpected)" not in out, out
    assert "every worker failed" in out, out


def test_a_job_wide_error_ends_the_job_with_a_discovery_script(tmp_path):
    """The same race with an error the coordinator decides at once for every
    rank (a shape mismatch; the GradflowError is `job_wide`) and a discovery
    script, so the driver cannot know that no worker will come: rank 1,
    told of rank 0's exit before its error reached elastic.run, rolled back
    and the driver waited --elastic-timeout (here 60 s; 600 s by default).
    Now every rank re-raises its own error and the job ends in seconds."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    code, out = _elastic_job(["--min-np", "2", "--max-np", "2", "--host-discovery-script",
                              str(script), "--elastic-timeout", "60"],
                             "elastic_partial_commit_script.py", ELASTIC_MISMATCH="1")
    assert code == 1, out
    for rank in (0, 1):
        assert f"rank {rank} raised: gradflow: mismatched allreduce 'mismatched'" in out, out
    assert "generation 1" not in out and "finished (unexpected)" not in out, out
