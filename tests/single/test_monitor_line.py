"""Unit tests for gradflowrun --monitor without MPI: the status line built
from rank snapshots (runner/monitor_line.py), the rank-side snapshot from a
StatsDelta-like object and its atomic file (gradflow/monitor.py), and the
--monitor flag's parsing and environment (launch.py)."""

import json
import re

import pytest

from gradflow import monitor as M
from gradflow.runner import launch as L
from gradflow.runner import monitor_line as ML

NOW = 1000.0


def snap(rank, steps_per_s, mb, comm, steps, step_s=None, age=0.5):
    return {"rank": rank, "time": NOW - age, "steps": steps, "steps_per_s": steps_per_s,
            "bytes_sent_per_s": mb * 1e6, "comm_fraction": comm, "step_seconds": step_s}


def test_line_aggregates_ranks_and_names_the_slowest():
    line = ML.format_line({0: snap(0, 10.0, 1.5, 0.2, 50, 0.1),
                           1: snap(1, 8.0, 0.5, 0.4, 48, 0.125)}, 2, 1.0, now=NOW)
    assert line == ("gradflowrun: monitor: 9 steps/s | 2 MB/s sent | comm 30% | "
                    "slowest rank 1 (8 steps/s, 0.125 s/step, 48 steps)")
    assert not line.startswith("[")  # the launcher's own line, no rank prefix


def test_slowest_tie_goes_to_fewest_steps_then_lowest_rank():
    snaps = {r: snap(r, 5.0, 0.0, 0.0, steps) for r, steps in ((0, 9), (1, 7), (2, 7))}
    assert "slowest rank 1 (5 steps/s, 7 steps)" in ML.format_line(snaps, 3, 1.0, now=NOW)


def test_no_snapshot_no_line_and_missing_or_stale_ranks_are_said():
    assert ML.format_line({}, 2, 1.0, now=NOW) is None
    line = ML.format_line({0: snap(0, 3.0, 0.1, 0.5, 9, 0.3),
                           2: snap(2, 0.0, 0.0, 0.9, 4, None, age=10.0)}, 4, 2.0, now=NOW)
    assert "slowest rank 2 (0 steps/s, 4 steps)" in line  # no s/step without a step
    assert line.endswith("| silent: rank 2 | 2/4 ranks reporting (local ranks only)")


def test_bad_or_partial_snapshots_do_not_break_the_line(tmp_path):
    (tmp_path / "rank.0.monitor").write_text("{not json")
    (tmp_path / "rank.1.monitor").write_text(json.dumps({"rank": 1, "steps_per_s": "x"}))
    snaps = ML.read_snapshots(str(tmp_path), 2)
    assert list(snaps) == [1]
    assert ML.format_line(snaps, 2, 1.0, now=NOW).startswith("gradflowrun: monitor: 0 steps/s")


class FakeDelta:
    """StatsDelta's interface: take(steps) -> per-step scalars under prefix."""
    prefix = "gradflow/"

    def __init__(self, wall, bytes_sent, comm_seconds):
        self.wall, self.bytes, self.comm, self.calls = wall, bytes_sent, comm_seconds, []

    def take(self, steps):
        self.calls.append(steps)
        return {"gradflow/step_seconds": self.wall / steps,
                "gradflow/bytes_sent_per_step": self.bytes / steps,
                "gradflow/comm_fraction": self.comm / self.wall}


def test_rank_snapshot_rates_and_file_round_trip(tmp_path):
    s = M.snapshot(FakeDelta(2.0, 4e6, 0.5), steps_now=30, steps_before=10, rank=3)
    assert (s["steps"], s["steps_per_s"], s["bytes_sent_per_s"]) == (30, 10.0, 2e6)
    assert (s["comm_fraction"], s["step_seconds"], s["interval_s"]) == (0.25, 0.1, 2.0)
    M.write_snapshot(str(tmp_path), s)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank.3.monitor"]  # no .tmp left
    assert ML.read_snapshots(str(tmp_path), 4) == {3: s}


def test_rank_snapshot_without_a_step_still_advances():
    d = FakeDelta(1.5, 3e6, 0.3)
    s = M.snapshot(d, steps_now=7, steps_before=7, rank=0)
    assert d.calls == [1]  # take(1): the baseline moves, wall time is the interval
    assert (s["steps_per_s"], s["step_seconds"], s["bytes_sent_per_s"]) == (0.0, None, 2e6)


def test_monitor_flag_parsing_and_environment(tmp_path):
    parse = L.build_parser([]).parse_args
    assert parse(["-np", "2", "python", "t.py"]).monitor is None
    assert parse(["--monitor", "-np", "2", "python", "t.py"]).monitor == ML.DEFAULT_INTERVAL
    args = parse(["--monitor", "0.5", "-np", "2", "python", "t.py"])
    assert args.monitor == 0.5
    _, env = L.build_launch(args, [], status_dir=str(tmp_path), base_env={})
    assert env[ML.DIR_ENV] == str(tmp_path) and float(env[ML.INTERVAL_ENV]) == 0.5
    _, env = L.build_launch(parse(["-np", "2", "python", "t.py"]), [],
                            status_dir=str(tmp_path), base_env={})
    assert ML.DIR_ENV not in env and ML.INTERVAL_ENV not in env  # no effect unless asked


@pytest.mark.parametrize("value", ["python", "0", "-1", "nan", "inf"])
def test_monitor_flag_rejects_non_positive_or_non_numbers(value, capsys):
    with pytest.raises(SystemExit):
        L.build_parser([]).parse_args(["-np", "2", "--monitor", value, "python", "t.py"])
    assert re.search(r"--monitor: expects a number of seconds > 0", capsys.readouterr().err)


def test_not_asked_no_thread(monkeypatch, tmp_path):
    monkeypatch.delenv(ML.DIR_ENV, raising=False)
    monkeypatch.setattr(M, "_thread", None)
    M.start_if_asked(0)
    assert M._thread is None
    monkeypatch.setenv(ML.DIR_ENV, str(tmp_path / "absent"))  # another host's status dir
    M.start_if_asked(0)
    assert M._thread is None


def test_thread_error_warns_once_and_stops(monkeypatch, tmp_path, capsys):
    """A snapshot that cannot be written ends monitoring with one line on
    stderr; _run returns instead of raising into the process."""
    import gradflow._native as native
    import gradflow.stats_scalars as scalars
    monkeypatch.setattr(native, "is_initialized", lambda: True)
    monkeypatch.setattr(scalars, "StatsDelta", lambda: FakeDelta(1.0, 0.0, 0.0))
    M._run(str(tmp_path / "gone"), 0.01, 5)
    err = capsys.readouterr().err
    assert err.count("gradflow: monitoring stopped on rank 5: FileNotFoundError") == 1, err
