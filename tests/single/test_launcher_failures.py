"""Unit tests for gradflowrun's job supervision without MPI (supervise.py,
rank_wrapper.py, notice.py): which rank is named as the one that failed
first, the exit code and report, the failure notices that reach the ranks,
and the wrappers' exit status files.
"""

import os
import sys
import time

from gradflow.runner import rank_wrapper as W
from gradflow.runner import supervise as S


def test_first_failed_rank_sets_the_exit_code(capsys):
    statuses = {0: (1, False), 1: (137, False), 2: (1, False)}
    assert S._report(0, statuses, 3, [], "failed", order=[1, 2, 0]) == 137
    err = capsys.readouterr().err
    assert err.index("rank 1 exited with code 137 (SIGKILL)") < err.index("rank 2 exited")
    assert "rank 1 failed first; rank(s) 2, 0 failed after it" in err


def test_an_agreed_error_blames_no_rank(capsys):
    # Every failed rank raised because the job had failed (third field: told,
    # or its runtime reported a peer's failure): e.g. the coordinator found
    # that the ranks' steps differ. No rank is named as the first.
    told = {0: (1, False, True), 1: (1, False, True), 2: (1, False, True)}
    assert S._report(0, told, 3, [], "", order=[1, 0, 2]) == 1
    err = capsys.readouterr().err
    assert "rank(s) 0, 1, 2 failed on one job-wide error" in err
    assert "failed first" not in err
    # One rank failed on its own (not told): it is blamed, as before.
    mixed = {0: (1, False, True), 1: (3, False, False), 2: (1, False, True)}
    assert S._report(0, mixed, 3, [], "", order=[1, 0, 2]) == 3
    err = capsys.readouterr().err
    assert "rank 1 failed first; rank(s) 0, 2 failed after it" in err
    assert "job-wide" not in err
    # Told, and a rank exited 0: the "exited with code 0" explanation instead.
    early = {0: (1, False, True), 1: (0, False, False), 2: (1, False, True)}
    assert S._report(0, early, 3, [], "", order=[0, 2]) == 1
    err = capsys.readouterr().err
    assert "rank(s) 1 exited with code 0" in err and "job-wide" not in err
    # A rank a signal ended failed on its own, even when the notice of the
    # failure reached its wrapper too (CI, SIGKILL inside halving-doubling:
    # the job was reported as one job-wide error and no rank was blamed).
    killed = {0: (1, False, True), 1: (1, False, True), 2: (137, False, True),
              3: (1, False, True)}
    assert S._report(0, killed, 4, [], "", order=[2, 0, 1, 3]) == 137
    err = capsys.readouterr().err
    assert "rank 2 failed first; rank(s) 0, 1, 3 failed after it" in err and "job-wide" not in err


def test_a_rank_that_ended_gradflow_first_is_named(capsys, tmp_path):
    # Rank 1's program ended in order (fourth field: notice.FINISHED_ENV) and
    # waited in MPI_Finalize until stopped; the others' next collective failed
    # ("shutdown() was called on rank R"). It is named; no survivor is
    # blamed as the first to fail.
    statuses = {0: (1, False, False, False), 1: (143, True, False, True),
                2: (1, False, False, False)}
    assert S._report(0, statuses, 3, [], "failed", order=[0, 2]) == 1
    err = capsys.readouterr().err
    assert "gradflowrun: rank(s) 1 had already ended gradflow" in err
    assert "failed first" not in err
    # The wrapper's status line carries it (older lines without it still read).
    (tmp_path / "rank.0.exit").write_text("143 1 0 1\n")
    (tmp_path / "rank.1.exit").write_text("1 0 1\n")
    got = S._read_statuses(str(tmp_path), 2)
    assert got[0].finished and got[0].stopped and not got[1].finished and got[1].notified
    # A failed rank's own exception (fifth field): the usual report, no such guess.
    own = {0: (1, False, False, False, True), 1: (143, True, False, True, False),
           2: (1, False, False, False, False)}
    S._report(0, own, 3, [], "failed", order=[0, 2])
    err = capsys.readouterr().err
    assert "rank 0 failed first" in err and "had already ended" not in err


def test_a_signal_death_is_blamed_before_peers_that_noticed_it():
    statuses = {0: (1, False), 1: (137, False), 2: (1, False)}
    # Rank 0 noticed the dead peer and exited 0.3 s before rank 1's wrapper
    # reported the SIGKILL: rank 1 is still the one that failed first.
    assert S.failure_order({0: 10.0, 2: 10.1, 1: 10.3}, statuses) == [1, 0, 2]
    # A signal death long after an ordinary failure is not moved ahead of it.
    assert S.failure_order({0: 10.0, 1: 14.0}, statuses) == [0, 1]
    # Same instant: the killed rank first, then by rank.
    assert S.failure_order({2: 5.0, 1: 5.0 + S.SIGNAL_HEAD_START_SECONDS, 0: 5.0}, statuses) == [1, 0, 2]


def test_launcher_teardown_failure_after_every_rank_succeeded(capsys):
    ok = {0: (0, False), 1: (0, False)}
    assert S._report(-13, ok, 2, [], "") == 0  # mpiexec SIGPIPE at teardown
    assert "every rank exited with code 0; ignoring mpiexec's exit code 141" in capsys.readouterr().err
    assert S._report(-13, {0: (0, False)}, 2, [], "") == 141  # rank 1 unknown: trust mpiexec
    assert "mpiexec exited with code 141" in capsys.readouterr().err


# ------------------------------------------------ failure notices (notice.py)

def test_failure_notice_reaches_the_watcher():
    from gradflow.runner import notice as N
    r, w, env = N.open_channel()
    got = []
    try:
        assert N._claim({N.FD_ENV: str(r), N.ID_ENV: "0:0"}) is None  # not our pipe
        assert N._claim({N.FD_ENV: "x", N.ID_ENV: env[N.ID_ENV]}) is None
        env_copy = dict(env)
        assert not N._watching  # importing gradflow outside gradflowrun watches nothing
        try:
            assert N.watch(got.append, environ=env_copy)
        finally:
            N._watching = False
        assert N.FD_ENV not in env_copy  # children of the rank do not claim it again
        N.send(w, "rank 1 was killed\nby SIGKILL")
        for _ in range(200):
            if got:
                break
            time.sleep(0.01)
        assert got == ["rank 1 was killed by SIGKILL"]
    finally:
        os.close(w)
    assert N.describe_exit(1, 137) == "rank 1 was killed by SIGKILL"
    assert N.describe_exit(2, 3) == "rank 2 exited with code 3"


def test_a_notice_the_rank_could_not_read_does_not_count_as_told(tmp_path):
    """A rank SIGKILLed before gradflowrun's notice, whose wrapper a busy
    machine ran only after the notice was written, was marked "notified"
    and so was not blamed first (a CI failure of test_faults.py's
    3-1-mid-ring case). Only a notice the rank could still read counts."""
    import threading
    from gradflow.runner import notice as N
    (tmp_path / W.NOTICE_FILE).write_text("rank 2 exited with code 1\n")
    for alive in (True, False):
        r, w = os.pipe()
        if not alive:
            os.close(r)  # the rank is dead: nobody holds the read end
        told = threading.Event()
        W._watch_peers(str(tmp_path), "1", threading.Event(), w, told)
        assert told.is_set() == alive
        if alive:
            assert os.read(r, 200).startswith(b"gradflowrun reports that rank 2 exited")
            os.close(r)
        os.close(w)
    r, w = os.pipe()
    assert N.send(w, "x")
    os.close(r)
    assert not N.send(w, "x")  # EPIPE: never raises
    os.close(w)


def test_ranks_told_of_a_failure_are_blamed_after_it():
    # Rank 0 failed at the same instant, but only after it was told of rank 2's failure.
    statuses = {0: (1, False, True), 2: (3, False, False)}
    assert S.failure_order({0: 5.0, 2: 5.0}, statuses) == [2, 0]
    assert S.failure_order({0: 4.0, 2: 9.0}, statuses) == [2, 0]


def test_hydra_notice_names_the_failed_peer(tmp_path):
    (tmp_path / "rank.1.exit").write_text("137 0 0\n")
    (tmp_path / "rank.2.exit").write_text("0 0 0\n")
    assert W._hydra_notice(str(tmp_path), "0") == "rank 1 was killed by SIGKILL"
    # Rank 0 raised after being told (third field 1) and ended later: rank 1,
    # the first failure, is named first whatever the rank numbers say.
    (tmp_path / "rank.0.exit").write_text("1 0 1\n")
    os.utime(tmp_path / "rank.1.exit", (1000.0, 1000.0))
    os.utime(tmp_path / "rank.0.exit", (1001.0, 1001.0))
    assert W._hydra_notice(str(tmp_path), "2") == (
        "rank 1 was killed by SIGKILL; rank 0 exited with code 1")
    (tmp_path / "rank.0.exit").write_text("1 0 0\n")  # not told, but ended later
    os.utime(tmp_path / "rank.0.exit", (1001.0, 1001.0))
    assert W._hydra_notice(str(tmp_path), "2") == (
        "rank 1 was killed by SIGKILL; rank 0 exited with code 1")
    (tmp_path / "rank.0.exit").unlink()
    (tmp_path / "rank.1.exit").unlink()
    assert W._hydra_notice(str(tmp_path), "0") == (
        "a rank ended without finalizing MPI (hydra sent SIGUSR1); rank 2 exited with code 0")


def test_failures_seen_only_after_the_launcher_ended_are_still_ordered(tmp_path, capsys,
                                                                        monkeypatch):
    # All ranks end within one poll, together with mpiexec: ranks 0 and 2
    # failed after being told of rank 1's failure, so rank 1 is named first.
    # Two races of the test's own, not the launcher's (3 in 300 runs under
    # load, 2026-11-29): a poll reads the files one by one, so it can miss
    # rank.0.exit, then find rank.2.exit written meanwhile: rank 2 is seen a
    # poll before rank 0 and listed first among the ranks told ("2, 0"; the
    # writes' atomicity does not matter, an empty read is skipped and read
    # again). And a shell descheduled for FAILURE_GRACE_SECONDS (3 s)
    # between its writes is stopped before it writes the rest.
    monkeypatch.setattr(S, "FAILURE_GRACE_SECONDS", 600.0)
    d = str(tmp_path)
    script = (f"echo '1 0 1' > {d}/rank.0.exit; echo '3 0 0' > {d}/rank.1.exit; "
              f"echo '1 0 1' > {d}/rank.2.exit; exit 3")
    assert S.run_job(["sh", "-c", script], dict(os.environ), 3, [], 30.0, d) == 3
    err = capsys.readouterr().err
    assert ("rank 1 failed first; rank(s) 0, 2 failed after it" in err
            or "rank 1 failed first; rank(s) 2, 0 failed after it" in err), err


def test_failures_one_poll_finds_are_ordered_by_when_they_ended(tmp_path, capsys, monkeypatch):
    """Rank 2 fails (exit 3), then rank 0 (exit 1), neither told of the
    other, both before the launcher's next poll: rank 0 was named first
    (one poll's failures tied; lower rank won: 10 of 10 real 3-rank jobs
    with the two exits 10 ms apart). The wrappers' exit files say when each
    rank ended; that orders them. No timing here: rank 2's file is written
    first, so no poll can see rank 0's without it (a poll between the two
    writes sees rank 2 a poll earlier: the same answer), and the times are
    written by hand. The grace period is long so that a descheduled shell
    is not stopped between its writes."""
    monkeypatch.setattr(S, "FAILURE_GRACE_SECONDS", 600.0)
    d = str(tmp_path)
    script = (f"echo '3 0 0 0 0 1000.500000' > {d}/rank.2.exit; "
              f"echo '1 0 0 0 0 1000.510000' > {d}/rank.0.exit; exit 1")
    assert S.run_job(["sh", "-c", script], dict(os.environ), 3, [], 30.0, d) == 3
    err = capsys.readouterr().err
    assert "rank 2 failed first; rank(s) 0 failed after it" in err, err
    assert err.index("rank 2 exited with code 3") < err.index("rank 0 exited with code 1"), err
    # Without a time in the file (an older wrapper's line): its mtime.
    (tmp_path / "rank.0.exit").write_text("1 0 0\n")
    (tmp_path / "rank.2.exit").write_text("3 0 0\n")
    os.utime(tmp_path / "rank.2.exit", (900.0, 900.0))
    os.utime(tmp_path / "rank.0.exit", (901.0, 901.0))
    statuses = S._read_statuses(d, 3)
    assert (statuses[2].ended, statuses[0].ended) == (900.0, 901.0)
    assert S.failure_order({0: 7.0, 2: 7.0}, statuses) == [2, 0]
    # A rank whose process the launcher saw dead before its wrapper wrote
    # (a busy machine ran the wrapper late) counts from when it was seen.
    assert S.failure_order({0: 7.0, 2: 7.0}, statuses, gone_wall={0: 800.0}) == [0, 2]
    # Seen by different polls: the poll order stands.
    assert S.failure_order({0: 6.0, 2: 7.0}, statuses) == [0, 2]


def test_the_wrapper_writes_when_its_command_ended(tmp_path):
    """rank_wrapper's exit file: code stopped notified finished own ended."""
    import subprocess
    env = dict(os.environ, PMI_RANK="1", **{W.STATUS_DIR_ENV: str(tmp_path)})
    before = time.time()
    r = subprocess.run([sys.executable, W.__file__, "--", "sh", "-c", "exit 3"], env=env)
    after = time.time()
    assert r.returncode == 3
    fields = (tmp_path / "rank.1.exit").read_text().split()
    assert fields[:5] == ["3", "0", "0", "0", "0"], fields
    got = S._read_statuses(str(tmp_path), 2)[1]
    assert got.code == 3 and before <= got.ended <= after, (before, got, after)
