"""Elastic TensorFlow 2 without Keras fit (gradflow.tensorflow.elastic):
3 workers under `gradflowrun --min-np 2 -np 3 --max-np 3` train the digits
MLP with DistributedGradientTape in a tf.function; worker 2 is SIGKILLed at
step 30 (after the commit at step 28). The reduction inside the tf.function
fails with a TensorFlow error, which `run` turns into HorovodInternalError:
the survivors roll back to step 28, re-form and end with identical
variables and an accuracy close to the fault-free run's (elastic_tf_script.py)."""
import glob
import json
import os
import subprocess
import sys

from _launch import HERE, rank_env, run_cwd, skip_unless_hydra

SCRIPT = os.path.join(HERE, "elastic_tf_script.py")


def _run(log_dir, kill=""):
    log_dir.mkdir()
    env = rank_env()
    env.update(ELASTIC_LOG=str(log_dir), ELASTIC_KILL=kill, ELASTIC_EPOCHS="3")
    cmd = [sys.executable, "-m", "gradflow.runner.launch", "--min-np", "2", "-np", "3",
           "--max-np", "3", "--start-timeout", "150", sys.executable, SCRIPT]
    try:
        p = subprocess.run(cmd, env=env, cwd=run_cwd(), capture_output=True, text=True,
                           timeout=400)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"timed out\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}") from None
    out = f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}"
    assert p.returncode == 0, out
    evs = {}
    for path in glob.glob(os.path.join(str(log_dir), "worker-*.jsonl")):
        with open(path) as f:
            evs[os.path.basename(path)[:-6]] = [json.loads(line) for line in f]
    res = {w: e for w, es in evs.items() for e in es if e["event"] == "result"}
    return evs, res, out


@skip_unless_hydra("elastic workers are started with the mpich wheel's mpiexec")
def test_tf_gradient_tape_survives_sigkill(tmp_path):
    _, clean, out = _run(tmp_path / "clean")
    assert sorted(clean) == ["worker-0", "worker-1", "worker-2"], out
    assert len({r["hash"] for r in clean.values()}) == 1, clean
    clean_acc = clean["worker-0"]["acc"]
    assert clean_acc > 0.85, clean

    evs, res, out = _run(tmp_path / "faulty", kill="2:30")
    assert any(e["event"] == "kill" for e in evs["worker-2"]), out
    assert sorted(res) == ["worker-0", "worker-1"], out
    assert {r["size"] for r in res.values()} == {2}, res
    assert len({r["hash"] for r in res.values()}) == 1, "survivors ended with different variables"
    for w in ("worker-0", "worker-1"):
        steps = [e["step"] for e in evs[w] if e["event"] == "step"]
        assert steps == [1, 29], (w, steps)  # rolled back to the commit at step 28
        assert [e["size"] for e in evs[w] if e["event"] == "reset"] == [2], evs[w]
        assert abs(res[w]["acc"] - clean_acc) < 0.05, (res, clean_acc)
