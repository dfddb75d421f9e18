"""Files gradflow creates never follow a planted symbolic link or use a
predictable temporary name: --output-filename logs (rank_wrapper.py), the
timeline (native/timeline.cc), Keras BestModelCheckpoint's temporary file."""
import os
import subprocess
import sys

import pytest

from gradflow.runner import rank_wrapper as W

from _launch import ROOT, rank_env, run_cwd


def test_output_logs_replace_planted_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "logs"
    (out / "rank.0").mkdir(parents=True)
    (out / "rank.0" / "stdout").symlink_to(victim)
    os.link(victim, out / "rank.0" / "stderr")  # a hard link is not written through either
    dir_fd = W.open_log_dir(str(out), "0")
    try:
        for name in ("stdout", "stderr"):
            with W.open_log(dir_fd, name) as f:
                f.write(b"log line\n")
    finally:
        os.close(dir_fd)
    assert victim.read_text() == "precious\n"
    assert not (out / "rank.0" / "stdout").is_symlink()
    assert (out / "rank.0" / "stdout").read_text() == "log line\n"
    assert (out / "rank.0" / "stderr").read_text() == "log line\n"


def test_output_rank_folder_planted_as_a_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "logs"
    out.mkdir()
    (out / "rank.1").symlink_to(elsewhere)
    with pytest.raises(OSError):
        W.open_log_dir(str(out), "1")
    # The wrapper says so and fails the rank before running the command.
    env = dict(os.environ, PMI_RANK="1", GRADFLOWRUN_OUTPUT_DIR=str(out))
    r = subprocess.run([sys.executable, W.__file__, "--", sys.executable, "-c", "print('ran')"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "symbolic link" in r.stderr and "ran" not in r.stdout
    assert list(elsewhere.iterdir()) == []


def _init_with_timeline(path):
    # The gradflow under test: the in-place build, or (CI) the installed one
    # from outside the source tree.
    env = dict(rank_env(), GRADFLOW_TIMELINE=str(path))
    code = "import gradflow as gf\ngf.init()\ngf.shutdown()\nprint('ok')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=run_cwd())


def test_timeline_does_not_follow_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "timeline.json"
    link.symlink_to(victim)
    r = _init_with_timeline(link)
    assert r.returncode != 0 and "symbolic link" in r.stderr, r.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _init_with_timeline(fifo)  # refused, not blocked on
    assert r.returncode != 0 and "cannot open timeline file" in r.stderr, r.stderr[-2000:]
    plain = tmp_path / "plain.json"
    plain.write_text("x" * 100000)  # an old, longer trace is truncated
    r = _init_with_timeline(plain)
    assert r.returncode == 0, r.stderr[-2000:]
    assert plain.read_text().startswith("[\n") and len(plain.read_text()) < 100000


def test_keras_checkpoint_temp_file_is_private_and_synced(tmp_path, monkeypatch):
    pytest.importorskip("keras")
    from gradflow.keras import callbacks as C
    target = tmp_path / "best.keras"
    # What the old predictable name would have been: a planted link there is ignored.
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f".tmp-{os.getpid()}-best.keras").symlink_to(victim)
    synced, seen = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(C.os, "fsync", lambda fd: (synced.append(os.readlink(
        f"/proc/self/fd/{fd}")), real_fsync(fd))[1])

    def save(tmp):
        seen.append(tmp)
        assert os.path.dirname(os.path.dirname(tmp)) == str(tmp_path)  # same filesystem
        assert (os.stat(os.path.dirname(tmp)).st_mode & 0o777) == 0o700
        with open(tmp, "w") as f:
            f.write("model")

    C._save_atomically(str(target), save)
    assert target.read_text() == "model" and victim.read_text() == "precious\n"
    assert synced == [os.path.join(os.path.dirname(seen[0]), "best.keras"), str(tmp_path)] or (
        synced[-1] == str(tmp_path) and len(synced) == 2), synced
    assert not os.path.exists(os.path.dirname(seen[0]))  # scratch folder removed


def test_example_checkpoint_is_synced_before_the_rename(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "pytorch_digits_example", os.path.join(ROOT, "examples", "pytorch_digits.py"))
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(ex.os, "fsync", lambda fd: (events.append(
        ("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(ex.os, "replace", lambda a, b: (events.append(("replace", a)),
                                                        real_replace(a, b))[1])
    model = torch.nn.Linear(2, 2)
    path = tmp_path / "ckpt.pt"
    ex.save_checkpoint(str(path), model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    tmp = events[0][1]
    assert os.path.basename(tmp).startswith(".tmp-ckpt-") and os.path.dirname(tmp) == str(tmp_path)
    assert events == [("fsync", tmp), ("replace", tmp), ("fsync", str(tmp_path))]
    assert torch.load(path)["epoch"] == 3
