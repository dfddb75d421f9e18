"""GRADFLOW_TIMELINE writes Chrome-trace JSON covering every collective run."""
import json

import pytest

from _launch import run_mpi


def load(path):
    """The trace's events (it must be valid JSON: a closed array), row names
    by tid, and span lists by row name."""
    events = json.loads(path.read_text())
    assert isinstance(events, list) and events
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(set(rows.values())) == len(rows)  # one row per name
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0 and e["pid"] == 0 and e["tid"] in rows
    by_row = {}
    for e in spans:
        by_row.setdefault(rows[e["tid"]], []).append(e)
    return events, rows, by_row


def check_global_rows(events, rows, by_row):
    """timeline_script.py's collectives of the global set."""
    for k in range(4):
        names = [e["name"] for e in by_row[f"grad.{k}"]]
        assert names.count("NEGOTIATE") == 3 and names.count("ALLREDUCE") == 3, names
        ar = [e for e in by_row[f"grad.{k}"] if e["name"] == "ALLREDUCE"][0]
        assert ar["args"]["algo"] in ("ring", "two-sync", "mpi") and ar["args"]["wire"] == "fp32"
    assert [e["name"] for e in by_row["gathered"]] == ["NEGOTIATE", "ALLGATHER"]
    assert [e["name"] for e in by_row["bcast"]] == ["NEGOTIATE", "BROADCAST"]
    marks = [e["name"] for e in events if e["ph"] == "i" and rows[e["tid"]] == "steps"]
    assert marks == ["step 0", "step 1", "step 2"]


@pytest.mark.parametrize("n", [2, 3])
def test_timeline_structure_and_coverage(n, tmp_path):
    path = tmp_path / "timeline.json"
    run_mpi(n, "timeline_script.py", env={"GRADFLOW_TIMELINE": str(path)}, timeout=120)
    events, rows, by_row = load(path)
    check_global_rows(events, rows, by_row)
    assert [e["name"] for e in events if e["ph"] == "i"] == ["step 0", "step 1", "step 2"]


@pytest.mark.parametrize("n", [2, 3])
def test_timeline_mark_cycles(n, tmp_path):
    """GRADFLOW_TIMELINE_MARK_CYCLES (horovodrun --timeline-mark-cycles): one
    instant event per coordination cycle that ran collectives, on its own row;
    the step marks are unchanged (without it there are none: test above)."""
    path = tmp_path / "timeline.json"
    run_mpi(n, "timeline_script.py", timeout=120,
            env={"GRADFLOW_TIMELINE": str(path), "GRADFLOW_TIMELINE_MARK_CYCLES": "1"})
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    marks = [e for e in events if e["ph"] == "i"]
    cycles = [e for e in marks if rows[e["tid"]] == "cycles"]
    assert [e["name"] for e in marks if rows[e["tid"]] == "steps"] == ["step 0", "step 1", "step 2"]
    assert {e["name"] for e in cycles} == {"CYCLE_START"}
    # 14 collectives: each step's 4 allreduces need >= 1 cycle (3 steps), then
    # the allgather and the broadcast run in later cycles; at most one per name.
    assert 5 <= len(cycles) <= 14, len(cycles)
    execs = sorted(e["ts"] for e in events if e["ph"] == "X" and e["name"] != "NEGOTIATE")
    assert cycles[0]["ts"] <= execs[0]  # a cycle's mark precedes the work it runs


def test_timeline_after_init_again_keeps_each_runtime(tmp_path):
    """shutdown() then init() again: the first runtime's file stays whole,
    the k-th init() writes <path>.init<k> (Note [One timeline file per
    runtime], gradflow/_runtime.py). Before, every init() truncated the one
    file, so only the last runtime's events remained."""
    path = tmp_path / "timeline.json"
    run_mpi(2, "timeline_script.py", "reinit", env={"GRADFLOW_TIMELINE": str(path)},
            timeout=120)
    check_global_rows(*load(path))
    for k, name in ((2, "second"), (3, "third")):
        events, rows, by_row = load(tmp_path / f"timeline.json.init{k}")
        assert set(rows.values()) == {"steps", name}, rows
        assert [e["name"] for e in by_row[name]] == ["NEGOTIATE", "ALLREDUCE"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "timeline.json", "timeline.json.init2", "timeline.json.init3"]


def test_timeline_process_sets(tmp_path):
    """Rank 0's timeline records the collectives of the process sets it
    belongs to, on rows "set<id>/<name>" (cycle marks on "set<id>/cycles"),
    from GRADFLOW_TIMELINE and after start_timeline at run time; a set
    without rank 0 ({1}) cannot appear; the global set's rows are as without
    sets; removing a set leaves the timeline open. Before, set engines wrote
    nothing. 3 ranks, sets {0, 2} (id 1) and {1} (id 2); results checked
    against numpy in timeline_script.py."""
    path = tmp_path / "timeline.json"
    run_mpi(3, "timeline_script.py", "sets", str(tmp_path), timeout=120,
            env={"GRADFLOW_TIMELINE": str(path), "GRADFLOW_TIMELINE_MARK_CYCLES": "1"})
    events, rows, by_row = load(path)
    check_global_rows(events, rows, by_row)
    set_rows = {name for name in rows.values() if name.startswith("set")}
    assert set_rows == {"set1/grad.0", "set1/gathered", "set1/cycles"}, set_rows
    # The global rows: timeline_script's, plus the two add_process_set agreements.
    assert set(rows.values()) - set_rows == {
        "steps", "cycles", "grad.0", "grad.1", "grad.2", "grad.3", "gathered", "bcast",
        "gradflow.process_set_change.0", "gradflow.process_set_change.1"}, rows
    assert [e["name"] for e in by_row["set1/grad.0"]] == ["NEGOTIATE", "ALLREDUCE"]
    ar = by_row["set1/grad.0"][1]
    assert ar["args"]["algo"] in ("ring", "two-sync", "mpi") and ar["args"]["wire"] == "fp32"
    assert [e["name"] for e in by_row["set1/gathered"]] == ["NEGOTIATE", "ALLGATHER"]
    assert len(by_row["grad.0"]) == 6 and [e["name"] for e in by_row["gathered"]] == [
        "NEGOTIATE", "ALLGATHER"]  # the global set's rows keep only its own spans
    set_cycles = [e for e in events if e["ph"] == "i" and rows[e["tid"]] == "set1/cycles"]
    assert 1 <= len(set_cycles) <= 2 and {e["name"] for e in set_cycles} == {"CYCLE_START"}

    events, rows, by_row = load(tmp_path / "runtime.json")  # start_timeline at run time
    assert set(rows.values()) == {"steps", "set1/late", "global.late"}, rows
    assert [e["name"] for e in by_row["set1/late"]] == ["NEGOTIATE", "ALLREDUCE"]
    assert [e["name"] for e in by_row["global.late"]] == ["NEGOTIATE", "ALLREDUCE"]

    # Started before remove_process_set; closed by shutdown() after it.
    events, rows, by_row = load(tmp_path / "after_remove.json")
    assert set(rows.values()) == {"steps", "gradflow.process_set_change.2",
                                  "gradflow.process_set_change.3", "after"}, rows
