"""Elastic Keras 3 model.fit (gradflow.keras.elastic): 3 workers under
`gradflowrun --min-np 2 -np 3 --max-np 3`, one SIGKILLed mid-epoch, after a
mid-epoch commit; the 2 survivors roll back to that commit, re-form, finish
the epoch's remaining samples and end with bitwise-identical weights and an
accuracy close to a fault-free run's (elastic_keras_script.py)."""
import json
import os
import subprocess
import sys

import pytest

from _launch import (HERE, change_hosts_after_first_step, gradflowrun_args, host_discovery, rank_env,
                     run_cwd, skip_unless_hydra)

SCRIPT = os.path.join(HERE, "elastic_keras_script.py")
EPOCHS = 3
# 1400 samples, 32 per rank: 14 steps per epoch with 3 ranks. Step 35 is the
# 8th batch of epoch 2 (steps 28..41); commits every 4 batches (step 32).
KILL_STEP, COMMIT_STEP = 35, 32


def _run(tmp_path, name, kill="", backend="tensorflow"):
    log_dir = tmp_path / name
    log_dir.mkdir()
    env = rank_env()
    env.update(ELASTIC_EPOCHS=str(EPOCHS), ELASTIC_LOG=str(log_dir), ELASTIC_KILL=kill,
               KERAS_BACKEND=backend)
    # --start-timeout: generation 0 must hold all 3 workers (the step and
    # reset counts below assume it); on a loaded host importing TensorFlow
    # can take longer than the default 30 s, and a late worker would join as
    # a newcomer (a correct elastic run, but a different one).
    cmd = [sys.executable, "-m", "gradflow.runner.launch", *gradflowrun_args(), "--min-np", "2",
           "-np", "3", "--max-np", "3", "--start-timeout", "150", sys.executable, SCRIPT]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env,
                              cwd=run_cwd())
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out\nstdout:\n{e.stdout}\n"
                             f"stderr:\n{e.stderr}") from None
    out = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"gradflowrun exited with {proc.returncode}\n{out}"
    events = {}
    for path in log_dir.iterdir():
        with open(path) as f:
            events[path.stem] = [json.loads(line) for line in f]
    return events, out


def _results(events):
    return {w: next(e for e in evs if e["event"] == "result")
            for w, evs in events.items() if any(e["event"] == "result" for e in evs)}


@skip_unless_hydra("elastic workers are started with the mpich wheel's mpiexec")
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_keras_fit_survives_sigkill(tmp_path, backend):
    clean, out = _run(tmp_path, "clean", backend=backend)
    clean_results = _results(clean)
    assert sorted(clean_results) == ["worker-0", "worker-1", "worker-2"], out
    assert {r["backend"] for r in clean_results.values()} == {backend}, clean_results
    assert len({r["hash"] for r in clean_results.values()}) == 1, clean_results
    clean_acc = clean_results["worker-0"]["acc"]
    assert clean_acc > 0.85, clean_results  # 3 epochs of SGD on digits (measured 0.922)

    faulty, out = _run(tmp_path, "faulty", kill=f"2:{KILL_STEP}", backend=backend)
    assert any(e["event"] == "kill" and e["step"] == KILL_STEP for e in faulty["worker-2"]), out
    results = _results(faulty)
    assert sorted(results) == ["worker-0", "worker-1"], out
    assert {r["size"] for r in results.values()} == {2}, results
    assert {r["rank"] for r in results.values()} == {0, 1}, results
    assert len({r["hash"] for r in results.values()}) == 1, results
    for w in ("worker-0", "worker-1"):
        evs = faulty[w]
        resets = [e for e in evs if e["event"] == "reset"]
        assert len(resets) == 1 and resets[0]["size"] == 2, evs
        # The first step after the reset redoes the first batch after the
        # commit (rolled back from step 35 to 32).
        steps = [e for e in evs if e["event"] == "step"]
        assert [s["step"] for s in steps] == [1, COMMIT_STEP + 1], evs
        # Epoch 2's remaining 1400 - 4*96 samples in 64-sample global batches.
        r = results[w]
        assert r["steps"] == 2 * 14 + 4 + (1400 - 4 * 96) // 64, r
        assert abs(r["acc"] - clean_acc) < 0.05, (r, clean_acc)


@skip_unless_hydra("elastic workers are started with the mpich wheel's mpiexec")
def test_keras_fit_grows_onto_an_added_host(tmp_path):
    """The discovery script offers 2 slots, then 3 once training runs: the
    new worker starts, the running ones are interrupted at a commit (inside
    fit, by CommitStateCallback), and all 3 finish with the same weights; the
    newcomer's first step continues the global step count (it received the
    state by broadcast)."""
    hosts, script = host_discovery(tmp_path, "localhost:2\n")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = rank_env()
    env.update(ELASTIC_EPOCHS=str(EPOCHS), ELASTIC_LOG=str(log_dir), ELASTIC_STEP_SLEEP="0.05",
               ELASTIC_WAIT="3:1")
    # --elastic-timeout 120: a generation that does not form (once under
    # load the newcomer hung in MPI_Comm_connect past the test's timeout)
    # ends the job within it, saying where (Note [A generation that does
    # not form], gradflow/runner/elastic_forming.py).
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "--min-np", "2", "--max-np", "3",
           "--start-timeout", "150", "--elastic-timeout", "120",
           "--host-discovery-script", str(script), sys.executable, SCRIPT]
    p = subprocess.Popen(cmd, env=env, cwd=run_cwd(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        change_hosts_after_first_step(p, log_dir, hosts, "localhost:3\n", wait_s=200)
        out, _ = p.communicate(timeout=400)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
    assert "generation 1: 3 worker(s)" in out, out
    events = {}
    for path in log_dir.iterdir():
        with open(path) as f:
            events[path.stem] = [json.loads(line) for line in f]
    results = _results(events)
    assert sorted(results) == ["worker-0", "worker-1", "worker-2"], out
    assert {r["size"] for r in results.values()} == {3}, results
    assert len({r["hash"] for r in results.values()}) == 1, results
    first = [e for e in events["worker-2"] if e["event"] == "step"]
    assert first and first[0]["step"] > 1, "the new worker did not start from the state"
    assert results["worker-0"]["acc"] > 0.85, results
