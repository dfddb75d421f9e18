"""gradflowrun's elastic options without starting workers: validation
(exit code 2 and a message, nothing started), the discovery script's output
format, and the blacklist's cooldown arithmetic."""
import math

import pytest

from gradflow.runner import launch
from gradflow.runner.elastic_hosts import (HostManager, confirm, parse_cooldown,
                                          parse_discovery_output)
from gradflow.runner.elastic_launch import check_elastic, is_elastic


def parse(argv):
    return launch.build_parser([]).parse_args(argv)


@pytest.mark.parametrize("argv,message", [
    (["--min-np", "3", "-np", "2", "python", "x.py"], "1 <= --min-np (3) <= -np (2)"),
    (["--max-np", "1", "-np", "2", "python", "x.py"], "-np (2) <= --max-np (1)"),
    (["--min-np", "0", "python", "x.py"], "1 <= --min-np (0)"),
    (["--max-np", "4", "python", "x.py"], "elastic mode needs -np or --min-np"),
    (["--min-np", "2", "--elastic-timeout", "0", "python", "x.py"], "--elastic-timeout must be > 0"),
    (["--min-np", "2", "--reset-limit", "-1", "python", "x.py"], "--reset-limit must be >= 0"),
    (["--min-np", "2", "--blacklist-cooldown-range", "5", "1", "python", "x.py"],
     "0 < LOW <= HIGH"),
    (["--min-np", "2", "-H", "a:2", "--host-discovery-script", "./d.sh", "python", "x.py"],
     "not both"),
    (["--min-np", "2", "--launcher", "openmpi", "python", "x.py"], "--launcher openmpi"),
    (["--min-np", "2"], "no command given"),
    (["--min-np", "2", "--monitor", "5", "python", "x.py"], "--monitor is not supported"),
    (["--min-np", "2", "--output-filename", "logs", "python", "x.py"],
     "--output-filename is not supported"),
])
def test_bad_elastic_options_are_refused(argv, message, capsys):
    args = parse(argv)
    assert is_elastic(args)
    with pytest.raises(ValueError, match=None) as e:
        check_elastic(args)
    assert message in str(e.value)
    # and through main(): exit code 2, the message, nothing started
    assert launch.main(argv, config_keys=[]) == 2
    assert message in capsys.readouterr().err


def test_defaults_and_spellings():
    args = parse(["--min-num-proc", "2", "--max-num-proc", "4", "python", "x.py"])
    hosts = check_elastic(args)
    assert (args.np, args.min_np, args.max_np) == (2, 2, 4)
    assert hosts.discover() == {"localhost": 4}
    assert not is_elastic(parse(["-np", "2", "python", "x.py"]))
    assert args.elastic_timeout == 600


def test_elastic_timeout_alone_is_not_elastic_and_says_so(capsys):
    argv = ["--elastic-timeout", "5", "-np", "0", "python", "x.py"]  # -np 0: stops before launching
    assert not is_elastic(parse(argv))
    assert launch.main(argv, config_keys=[]) == 2
    err = capsys.readouterr().err
    assert "--elastic-timeout has no effect: the job is not elastic" in err, err


def test_discovery_output():
    assert parse_discovery_output("a:2\n# comment\n\nb:1\n", None) == {"a": 2, "b": 1}
    assert parse_discovery_output("a\nb:3\n", 4) == {"a": 4, "b": 3}
    for bad, why in [("a\n", "no slot count"), ("a:x\n", "slots must be an integer"),
                     ("-oProxy:1\n", "host")]:
        with pytest.raises(ValueError, match=why):
            parse_discovery_output(bad, None)


def test_failing_discovery_script_keeps_the_last_answer(tmp_path):
    out = tmp_path / "hosts"
    out.write_text("a:2\n")
    m = HostManager(discovery_script=f"cat {out}")
    assert m.discover() == {"a": 2}
    out.unlink()
    assert m.discover() == {"a": 2}
    assert "failed" in m.last_error


def test_a_host_removal_takes_two_answers_in_a_row(tmp_path):
    """Note [A host removal is confirmed]: one answer without a host (the
    script read its file mid-rewrite: empty, or short of a line) keeps it;
    the next answer without it drops it. Additions count at once."""
    out = tmp_path / "hosts"
    m = HostManager(discovery_script=f"cat {out}")
    out.write_text("a:2\nb:1\n")
    assert m.discover() == {"a": 2, "b": 1}
    for torn in ("", "a:2\n"):
        out.write_text(torn)
        assert m.discover() == {"a": 2, "b": 1}, torn  # the driver dismissed b's (all) workers
        out.write_text("a:2\nb:1\n")
        assert m.discover() == {"a": 2, "b": 1}
    out.write_text("a:2\nc:4\n")
    assert m.discover() == {"a": 2, "c": 4, "b": 1}  # c at once; b not yet
    assert m.discover() == {"a": 2, "c": 4}  # b left twice in a row: removed
    out.write_text("b:1\n")
    assert m.discover() == {"b": 1, "a": 2, "c": 4}  # back at once; a, c pending
    assert m.discover() == {"b": 1}


def test_an_answer_cut_inside_a_line_changes_nothing(tmp_path):
    """Note [A host removal is confirmed]: the script's host file read while
    it is rewritten, cut inside a line: `localhost:12` as `localhost:1` (a
    slot reduction, which dismisses workers) and, with --slots-per-host,
    `host-10` as `host-1` (a host never meant). Both counted at once before
    2026-11-29; now a loss waits for the next answer, and a gain from an
    output without its final newline too. Whole answers still grow at once."""
    out = tmp_path / "hosts"
    m = HostManager(discovery_script=f"cat {out}")
    out.write_text("localhost:12\n")
    assert m.discover() == {"localhost": 12}
    out.write_text("localhost:1")
    assert m.discover() == {"localhost": 12}  # was {"localhost": 1}
    out.write_text("localhost:12\n")
    assert m.discover() == {"localhost": 12}
    m = HostManager(discovery_script=f"cat {out}", slots_per_host=2)
    out.write_text("host-2\nhost-10\n")
    assert m.discover() == {"host-2": 2, "host-10": 2}
    out.write_text("host-2\nhost-1")
    assert m.discover() == {"host-2": 2, "host-10": 2}  # was {"host-2": 2, "host-1": 2}
    out.write_text("host-2\nhost-10\n")
    assert m.discover() == {"host-2": 2, "host-10": 2}
    out.write_text("host-2:1\nhost-10\n")  # a real reduction: two answers in a row
    assert m.discover() == {"host-2": 2, "host-10": 2}
    assert m.discover() == {"host-2": 1, "host-10": 2}
    out.write_text("host-2:3\nhost-10\nhost-11\n")  # growth: at once
    assert m.discover() == {"host-2": 3, "host-10": 2, "host-11": 2}
    out.write_text("host-2:3\nhost-10\nhost-11\nhost-12")  # no final newline: a run later
    assert m.discover() == {"host-2": 3, "host-10": 2, "host-11": 2}
    assert m.discover() == {"host-2": 3, "host-10": 2, "host-11": 2, "host-12": 2}
    # Two answers that disagree: the smaller loss, the smaller gain.
    assert confirm({"a": 12}, {"a": 1}, {"a": 4}, True) == {"a": 4}
    assert confirm({"a": 1}, {"a": 9}, {"a": 3}, False) == {"a": 3}
    assert confirm({}, {"a": 9}, None, False) == {"a": 9}  # the first answer is taken as it is


def test_a_hanging_discovery_script_is_killed_whole(tmp_path, monkeypatch):
    """A script still running after DISCOVERY_TIMEOUT: the last answer
    stays, and what the shell was waiting for is killed with it (only the
    shell was before 2026-11-29: one orphan left per hung run)."""
    import os
    import time
    from gradflow.runner import elastic_hosts
    monkeypatch.setattr(elastic_hosts, "DISCOVERY_TIMEOUT", 1.0)
    pidfile, out = tmp_path / "pid", tmp_path / "hosts"
    out.write_text("a:2\n")
    m = HostManager(discovery_script=f"cat {out}")
    assert m.discover() == {"a": 2}
    m.script = f"sh -c 'echo $$ > {pidfile}; exec sleep 60'; cat {out}"
    assert m.discover() == {"a": 2}
    pid = int(pidfile.read_text())
    deadline = time.time() + 10
    while time.time() < deadline:  # gone, or a zombie until init reaps it
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        raise AssertionError(f"the script's sleep (pid {pid}) outlived its timeout")
    assert "still running after 1 s (killed)" in m.last_error, m.last_error


def test_blacklist_cooldown_doubles_up_to_high():
    m = HostManager(static={"a": 1, "b": 1}, cooldown_range=parse_cooldown([2, 5]))
    assert m.blacklist("a", now=0) == 2
    assert m.usable(now=1) == {"b": 1} and m.usable(now=2.5) == {"a": 1, "b": 1}
    assert m.blacklist("a", now=10) == 4
    assert m.blacklist("a", now=20) == 5  # capped at HIGH
    forever = HostManager(static={"a": 1})
    assert forever.blacklist("a", now=0) == math.inf and forever.usable(now=1e9) == {}
