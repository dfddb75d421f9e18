"""GRADFLOW_TIMELINE writes Chrome-trace JSON covering every collective run."""
import json

import pytest

from _launch import run_mpi


@pytest.mark.parametrize("n", [2, 3])
def test_timeline_structure_and_coverage(n, tmp_path):
    path = tmp_path / "timeline.json"
    run_mpi(n, "timeline_script.py", env={"GRADFLOW_TIMELINE": str(path)}, timeout=120)
    events = json.loads(path.read_text())  # must be valid JSON (closed array)
    assert isinstance(events, list) and events
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0 and e["pid"] == 0 and e["tid"] in rows
    by_row = {}
    for e in spans:
        by_row.setdefault(rows[e["tid"]], []).append(e)
    for k in range(4):
        names = [e["name"] for e in by_row[f"grad.{k}"]]
        assert names.count("NEGOTIATE") == 3 and names.count("ALLREDUCE") == 3, names
        ar = [e for e in by_row[f"grad.{k}"] if e["name"] == "ALLREDUCE"][0]
        assert ar["args"]["algo"] in ("ring", "two-sync", "mpi") and ar["args"]["wire"] == "fp32"
    assert [e["name"] for e in by_row["gathered"]] == ["NEGOTIATE", "ALLGATHER"]
    assert [e["name"] for e in by_row["bcast"]] == ["NEGOTIATE", "BROADCAST"]
    marks = [e["name"] for e in events if e["ph"] == "i"]
    assert marks == ["step 0", "step 1", "step 2"]


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
