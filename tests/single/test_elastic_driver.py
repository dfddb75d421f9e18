"""gradflowrun's elastic driver as a state machine, without processes: the
events a job would produce (exits, ready messages) are fed to it by hand
and what it sends back (assignments) and its exit status are checked."""
from gradflow.runner.elastic_driver import ElasticDriver, Worker
from gradflow.runner.elastic_hosts import HostManager


def driver(**kw):
    args = dict(np=2, min_np=1, max_np=3, elastic_timeout=5, reset_limit=None,
                start_timeout=1, mpiexec="mpiexec")
    args.update(kw)
    d = ElasticDriver(["python", "train.py"], {}, HostManager(static={"localhost": 3}), **args)
    d.server.close()  # no worker connects here
    d._fill_slots = lambda: None  # and none is launched
    return d


def worker(d, wid, state="running", gen=-1, rank=-1):
    w = Worker(str(wid), "localhost", wid)
    w.state, w.gen, w.rank = state, gen, rank
    w.sent = []
    w.send = w.sent.append
    d.workers[w.id] = w
    return w


def test_a_failure_after_another_worker_finished_fails_the_job(capsys):
    """Worker 0 ends its training (exit 0), then worker 1 fails (a crash
    while saving a checkpoint): gradflowrun used to exit 0. Its code is
    gradflowrun's, the first one if several fail; a signal is 128 + N."""
    d = driver()
    w0, w1, w2 = (worker(d, i, gen=0, rank=i) for i in range(3))
    d.gen, d.members = 0, [w0, w1, w2]
    d._on_exit(w0, 0)
    d._on_exit(w1, 3)
    d._on_exit(w2, -9)
    assert d._exit_code() == 3
    err = capsys.readouterr().err
    assert "training finished, but rank 1 (worker 1 on host localhost) exited with code 3" in err
    d = driver()
    w0, w1 = (worker(d, i, gen=0, rank=i) for i in range(2))
    d.gen, d.members = 0, [w0, w1]
    d._on_exit(w0, 0)
    d._on_exit(w1, -9)
    assert d._exit_code() == 128 + 9


def test_a_finished_message_before_the_others_fail_fails_the_job(capsys):
    """Worker 1's program ends in order: its exit hook says "finished" before
    gradflow shuts down, and the others' next collective fails; their exits
    can reach the driver before worker 1's own (still in MPI_Finalize).
    Once it exits 0 they count as failures after the finish (gradflowrun
    used to exit 0). If it exits non-zero instead (sys.exit(3)), nothing
    finished: as before. A dismissed worker's "finished" counts for nothing."""
    d = driver()
    w0, w1, w2 = (worker(d, i, gen=0, rank=i) for i in range(3))
    d.gen, d.members = 0, [w0, w1, w2]
    d._on_message(w1, {"op": "finished"})
    d._on_exit(w0, 1)
    d._on_exit(w2, 1)
    d._on_exit(w1, 0)
    assert d._exit_code() == 1
    assert "training finished, but rank 0 (worker 0 on host localhost) exited with code 1" in \
        capsys.readouterr().err
    d = driver()
    w0, w1, w2 = (worker(d, i, gen=0, rank=i) for i in range(3))
    d.gen, d.members = 0, [w0, w1, w2]
    d._on_message(w1, {"op": "finished"})
    d._on_exit(w1, 3)  # its program's own sys.exit(3): a failure during training
    assert not d.finished and d.resets == 1
    d._on_exit(w0, 0)
    d._on_exit(w2, 0)
    assert d._exit_code() == 0
    d = driver()
    w0, w1 = (worker(d, i, gen=0, rank=i) for i in range(2))
    d.gen, d.members = 0, [w0, w1]
    w1.dismiss = True
    d._on_message(w1, {"op": "finished"})
    assert not w1.finishing


def test_success_and_recovered_failures_still_exit_0():
    """A worker lost *during* training is what elastic mode survives: the
    job still succeeds when the others finish."""
    d = driver()
    w0, w1, w2 = (worker(d, i, gen=0, rank=i) for i in range(3))
    d.gen, d.members = 0, [w0, w1, w2]
    d._on_exit(w2, 9)   # lost mid-training: a reset
    assert d.resets == 1
    d._on_exit(w0, 0)
    d._on_exit(w1, 0)
    assert d._exit_code() == 0


def assignments(d):
    return {w.id: next(m for m in reversed(w.sent) if m["op"] == "assign")
            for w in d.workers.values() if any(m["op"] == "assign" for m in w.sent)}


def test_assignment_says_sync_when_a_newcomer_joins():
    """A host removed while another was added: the survivors' interrupt said
    'only removed, skip the sync' (ready with sync False), but the generation
    also holds a newcomer that syncs. The assignment tells every member to
    sync: all of them, or none, run State.sync's broadcasts."""
    d = driver(min_np=2)
    s0, s1 = worker(d, 0, gen=0, rank=0), worker(d, 1, gen=0, rank=1)
    new = worker(d, 3, state="ready")  # started on the added host, never in a generation
    d.gen, d.members = 0, [s0, s1]
    for w in (s0, s1):
        d._on_message(w, {"op": "ready", "gen": 0, "sync": False})
    d._try_form()
    a = assignments(d)
    assert sorted(a) == ["0", "1", "3"] and [a[i]["rank"] for i in "013"] == [0, 1, 2]
    assert all(m["sync"] is True for m in a.values()), a
    assert new.gen == 1


def test_assignment_skips_sync_only_when_no_member_wants_it():
    """Survivors only, none asking for a sync (hosts only removed): no sync.
    One survivor asking (it rolled back after a lost peer while the other
    saw only the removal): every member syncs."""
    for wishes, expect in [((False, False), False), ((False, True), True)]:
        d = driver(min_np=2)
        members = [worker(d, i, gen=3, rank=i) for i in range(2)]
        d.gen, d.members = 3, members
        for w, wish in zip(members, wishes):
            d._on_message(w, {"op": "ready", "gen": 3, "sync": wish})
        d._try_form()
        assert [m["sync"] for m in assignments(d).values()] == [expect] * 2, wishes


def test_a_failure_after_another_worker_finished_is_told_to_the_others():
    """Worker 0 finished; worker 1 dies while worker 2 may be waiting for it
    in a collective: worker 2 gets the failure notice naming worker 1 (the
    driver used to send none after a finish: it waited GRADFLOW_TIMEOUT).
    If it then rolls back and asks for a generation, it is told why none
    forms (abort, exit 1); a newcomer that was only waiting leaves quietly."""
    d = driver()
    w0, w1, w2 = (worker(d, i, gen=0, rank=i) for i in range(3))
    late = worker(d, 3, state="ready")  # started for a slot, never in a generation
    d.gen, d.members = 0, [w0, w1, w2]
    d._on_exit(w0, 0)
    d._on_exit(w1, 9)
    notices = [m for m in w2.sent if m["op"] == "failure"]
    assert len(notices) == 1 and notices[0]["gen"] == 0, w2.sent
    assert "rank 1 (worker 1 on host localhost) exited with code 9" in notices[0]["message"]
    assert not w0.sent and not w1.sent
    d._on_message(w2, {"op": "ready", "gen": 0, "sync": True})
    d._try_form()
    assert [m["op"] for m in w2.sent[1:]] == ["abort"], w2.sent
    assert "then rank 1 (worker 1 on host localhost) exited with code 9" in w2.sent[1]["message"]
    assert [m["op"] for m in late.sent] == ["exit"], late.sent
    assert d.gen == 0 and d._exit_code() == 9


def test_a_generation_that_does_not_form_ends_the_job(monkeypatch):
    """Note [A generation that does not form]: rank 2 never reports that it
    connected (inside MPI_Comm_connect, which cannot be interrupted). The job
    used to wait for ever; past max(--elastic-timeout, FORM_TIMEOUT_FLOOR)
    it ends naming where forming stopped, and the workers are killed after
    ABORT_GRACE (driver.run)."""
    import gradflow.runner.elastic_driver as ed
    from gradflow.runner.elastic_forming import FORM_TIMEOUT_FLOOR
    clock = [1000.0]
    monkeypatch.setattr(ed.time, "monotonic", lambda: clock[0])
    d = driver(min_np=3, elastic_timeout=5)
    ws = [worker(d, i, state="ready") for i in range(3)]
    d._try_form()
    assert d.forming == ws
    d._on_message(ws[0], {"op": "port", "gen": d.gen, "port": "tag#0$"})
    d._on_message(ws[1], {"op": "joined", "gen": d.gen})
    clock[0] += FORM_TIMEOUT_FLOOR  # the floor, not --elastic-timeout's 5 s
    d._check_forming()
    assert not d.aborted
    clock[0] += 1
    d._check_forming()
    assert d.aborted == (
        "the elastic job ended: generation 0 did not form within 60 s (--elastic-timeout, at "
        "least 60 s): rank 2 (worker 2 on host localhost) did not finish MPI_Comm_connect to "
        "rank 0's port (ranks 0-1 wait in MPI_Comm_accept); MPI's connect and accept cannot be "
        "interrupted, so its workers are stopped")
    assert all(w.sent[-1]["op"] == "abort" for w in ws)
    assert d.abort_deadline == clock[0] + ed.ABORT_GRACE and d._exit_code() == 1
    # A generation that formed in time is never ended.
    d = driver(min_np=2, elastic_timeout=5)
    ws = [worker(d, i, state="ready") for i in range(2)]
    d._try_form()
    for w in ws:
        d._on_message(w, {"op": "formed", "gen": d.gen})
    clock[0] += 3600
    d._check_forming()
    assert not d.aborted and d.members == ws


def test_a_generation_of_newcomers_only_says_the_progress_is_lost(capsys):
    """Every worker of generation 0 is gone (here dismissed with its host) and
    a newcomer forms generation 1 alone: it starts from the program's initial
    state. The job used to go on silently (and "succeed") from scratch."""
    d = driver(min_np=1)
    old = worker(d, 0, gen=0, rank=0)
    d.gen, d.members = 0, [old]
    old.dismiss = True
    d._on_exit(old, 0)
    worker(d, 1, state="ready")
    d._try_form()
    assert d.gen == 1
    assert ("no worker of generation 0 is left: generation 1 starts from the program's initial "
            "state (the progress so far is lost)") in capsys.readouterr().err
    # A survivor in the new generation: no such note.
    d = driver(min_np=2)
    s0 = worker(d, 0, state="ready", gen=0, rank=0)
    d.gen, d.members = 0, [s0]
    worker(d, 1, state="ready")
    d._try_form()
    assert d.gen == 1 and "is left" not in capsys.readouterr().err


def test_fewer_slots_dismiss_the_workers_beyond_them(tmp_path):
    """Horovod drops the workers beyond a host's slots when the discovery
    script lowers them; gradflowrun dismissed none (2026-11-29). Newcomers
    go first, then the highest ranks (rank 0 holds the state); the members
    are told (hosts_updated, removed). A cut answer (`localhost:3` read as
    `localhost:1`, then `host-10` as `host-1`) dismisses and starts no one."""
    out = tmp_path / "hosts"
    out.write_text("localhost:4\n")
    d = driver(max_np=5)  # room for a worker on host-1
    d.hosts = HostManager(discovery_script=f"cat {out}", slots_per_host=1)
    d.hosts.discover()
    launched = []
    d._launch = lambda host, slot: launched.append(host)
    del d._fill_slots  # the real one, with _launch recorded
    ws = [worker(d, i, gen=0, rank=i) for i in range(3)]
    new = worker(d, 3, state="ready")
    d.gen, d.members = 0, ws
    for text in ("localhost:1", "localhost:4\nhost-1"):
        out.write_text(text)
        d._on_hosts(d.hosts.discover())
        assert not any(w.dismiss for w in d.workers.values()) and launched == [], text
    out.write_text("localhost:2\n")
    for _ in range(2):
        d._on_hosts(d.hosts.discover())
    assert sorted(w.id for w in d.workers.values() if w.dismiss) == ["2", "3"]
    assert new.sent == [{"op": "exit"}]  # it was ready: it leaves now
    assert ws[0].sent == [{"op": "hosts_updated", "gen": 0, "removed": True}]
    assert launched == []


def test_a_discovery_script_that_lists_too_few_slots_waits_for_it(tmp_path, monkeypatch, capsys):
    """Note [A removal below --min-np waits]: the script prints nothing (or
    fails) for a while. Its error is said once, not every second, and when
    it works again. Nothing is dismissed while that would leave fewer than
    --min-np workers: it used to dismiss every worker after 2 s (the state
    lost, `every worker failed`); past --elastic-timeout the job ends."""
    import gradflow.runner.elastic_driver as ed
    clock = [1000.0]
    monkeypatch.setattr(ed.time, "monotonic", lambda: clock[0])
    out = tmp_path / "hosts"
    out.write_text("localhost:2\n")
    d = driver(min_np=1, elastic_timeout=5)
    d.hosts = HostManager(discovery_script=f"cat {out}")
    d.hosts.discover()
    ws = [worker(d, i, gen=0, rank=i) for i in range(2)]
    d.gen, d.members = 0, ws
    out.unlink()
    for _ in range(3):
        d._on_hosts(d.hosts.discover())
    err = capsys.readouterr().err
    assert err.count("failed") == 1, err
    out.write_text("")
    for _ in range(3):
        clock[0] += 1
        d._on_hosts(d.hosts.discover())
    err = capsys.readouterr().err
    assert err.count("works again") == 1, err
    assert "lists too few slots" in err and "fewer than --min-np 1" in err, err
    assert not any(w.dismiss or w.sent for w in ws) and not d.aborted
    out.write_text("localhost:2\n")  # it lists them again: the wait is over
    d._on_hosts(d.hosts.discover())
    assert d.short_since is None
    out.write_text("localhost:1\n")  # a slot fewer still leaves --min-np: dismissed
    for _ in range(2):
        d._on_hosts(d.hosts.discover())
    assert [w.dismiss for w in ws] == [False, True]
    out.write_text("")
    for _ in range(8):  # confirmed on the 2nd answer; more than 5 s after that
        clock[0] += 1
        d._on_hosts(d.hosts.discover())
    assert d.aborted and "listed too few slots for 5 s (--elastic-timeout)" in d.aborted, d.aborted
    assert ws[0].sent[-1]["op"] == "abort"


def test_reset_limit_counts_each_reformed_generation_once():
    """Note [What --reset-limit counts]: as in Horovod, a generation that
    ends counts once, whatever ended it. Two workers lost together (a host
    with 2 slots) are one reset, not two (--reset-limit 1 ended the job
    here); a re-formation for a host change counts too (it did not)."""
    d = driver(min_np=1, max_np=4, reset_limit=1)
    ws = [worker(d, i, gen=0, rank=i) for i in range(4)]
    d.gen, d.members = 0, ws
    d._on_exit(ws[3], 9)
    d._on_exit(ws[2], 9)
    assert d.resets == 1 and not d.aborted
    for w in ws[:2]:
        d._on_message(w, {"op": "ready", "gen": 0, "sync": True})
    d._try_form()
    assert d.gen == 1 and assignments(d)["1"]["size"] == 2 and d.resets == 1
    for w in ws[:2]:  # formed; then hosts change: both re-form at their next commit
        d._on_message(w, {"op": "formed", "gen": 1})
        d._on_message(w, {"op": "ready", "gen": 1, "sync": False})
    d._try_form()
    assert d.gen == 1 and d.resets == 2 and d.aborted == (
        "the elastic job ended: generation 1 re-forms (hosts added or removed); that is reset 2, "
        "more than --reset-limit 1; lost: rank 3 (worker 3 on host localhost) exited with code 9 "
        "(SIGKILL, if it was killed); rank 2 (worker 2 on host localhost) exited with code 9 "
        "(SIGKILL, if it was killed), after it was told of a peer's failure")
    assert all(w.sent[-1]["op"] == "abort" for w in ws[:2])


def test_a_host_removed_while_its_generation_forms_is_told(tmp_path):
    """A worker whose host leaves while its generation forms: the forming
    members are told (hosts_updated), so they re-form without it at their
    next commit. Only the last formed generation's members were told (none
    here): the dismissed worker trained on to the end of the job."""
    out = tmp_path / "hosts"
    out.write_text("localhost:2\n127.0.0.1:1\n")
    d = driver(min_np=2)
    d.hosts = HostManager(discovery_script=f"cat {out}")
    d.hosts.discover()
    ws = [worker(d, i, state="ready") for i in range(3)]
    ws[2].host = "127.0.0.1"
    d._try_form()
    assert d.forming == ws and d.gen == 0
    out.write_text("localhost:2\n")
    for _ in range(2):
        d._on_hosts(d.hosts.discover())
    assert ws[2].dismiss
    assert all(w.sent[-1] == {"op": "hosts_updated", "gen": 0, "removed": True} for w in ws)


def test_below_min_np_with_no_worker_to_come_ends_at_once(monkeypatch, capsys):
    """Note [Below --min-np for good]: 2 workers on a fixed host list
    (-np 2, --min-np 2); rank 0 exits 1 (here: of a stall its peer also
    got, which the peer, told of the exit first, took for a lost peer) and
    rank 1 asks for a generation. localhost is blacklisted for the rest of
    the job: no worker can ever join it. The job used to wait the whole
    --elastic-timeout (600 s by default: a hang); it ends at once, naming
    what was lost. With a cooldown, or a discovery script, a worker may
    still come: it waits as before, until --elastic-timeout."""
    import gradflow.runner.elastic_driver as ed
    clock = [1000.0]
    monkeypatch.setattr(ed.time, "monotonic", lambda: clock[0])

    def lose_rank_0(d):
        w0, w1 = (worker(d, i, gen=0, rank=i) for i in range(2))
        d.gen, d.members = 0, [w0, w1]
        d._on_exit(w0, 1)
        d._on_message(w1, {"op": "ready", "gen": 0, "sync": True})
        d._try_form()
        return w1

    d = driver(np=2, min_np=2, max_np=2, elastic_timeout=600)
    d.hosts = HostManager(static={"localhost": 2})
    w1 = lose_rank_0(d)
    assert d.aborted == (
        "the elastic job ended: 1 worker(s) ready, fewer than --min-np 2, and no other can ever "
        "start (a fixed host list, every host with a free slot blacklisted for the rest of the "
        "job); lost: rank 0 (worker 0 on host localhost) exited with code 1")
    assert w1.sent[-1]["op"] == "abort" and d._exit_code() == 1
    # A free slot on another host that is not blacklisted: a worker starts there.
    d = driver(np=2, min_np=2, max_np=3, elastic_timeout=600)
    d.hosts = HostManager(static={"localhost": 2, "otherhost": 1})
    lose_rank_0(d)
    assert not d.aborted
    for kw in ({"cooldown_range": (1.0, 2.0)}, {"discovery_script": "echo localhost:2"}):
        d = driver(np=2, min_np=2, max_np=2, elastic_timeout=600)
        d.hosts = HostManager(static=None if "discovery_script" in kw else {"localhost": 2}, **kw)
        d.hosts.discover()
        lose_rank_0(d)
        assert not d.aborted, kw
        clock[0] += 601
        d._try_form()
        assert d.aborted and "for 600 s (--elastic-timeout)" in d.aborted, kw
    # Both workers gone: nobody waits, the job ends by itself ("every worker failed").
    d = driver(np=2, min_np=2, max_np=2, elastic_timeout=600)
    d.hosts = HostManager(static={"localhost": 2})
    w0, w1 = (worker(d, i, gen=0, rank=i) for i in range(2))
    d.gen, d.members = 0, [w0, w1]
    d._on_exit(w0, 1)
    d._on_exit(w1, 1)
    d._try_form()
    assert not d.aborted and d._exit_code() == 1
    assert "every worker failed" in capsys.readouterr().err


def test_a_host_list_host_gets_workers_again_after_its_cooldown(monkeypatch):
    """Note [A cooldown ends on a fixed host list]: -np 2 --min-np 2
    --blacklist-cooldown-range 2 4, worker 1 SIGKILLed: localhost is out
    for 2 s, then its free slot must be filled again. Only the discovery
    poller and a worker's exit filled slots: with no discovery script the
    job waited --elastic-timeout and ended (seen end to end: 34 s, exit 1,
    with --elastic-timeout 30; now a worker 2 joins and the job exits 0)."""
    import gradflow.runner.elastic_driver as ed
    clock = [1000.0]
    monkeypatch.setattr(ed.time, "monotonic", lambda: clock[0])
    fills = []
    d = driver(np=2, min_np=2, max_np=2)
    d.hosts = HostManager(static={"localhost": 2}, cooldown_range=(2.0, 4.0))
    d._fill_slots = lambda: fills.append(clock[0])
    w0, w1 = (worker(d, i, gen=0, rank=i) for i in range(2))
    d.gen, d.members = 0, [w0, w1]
    d._on_exit(w1, 9)
    assert fills == [1000.0]  # (the exit's own fill: the host is still out)
    clock[0] += 1.5
    d._after_cooldowns()
    assert fills == [1000.0]
    clock[0] += 1
    d._after_cooldowns()
    d._after_cooldowns()
    assert fills == [1000.0, 1002.5]  # once per cooldown end
    # With a discovery script its poller fills the slots every second.
    d = driver(np=2, min_np=2, max_np=2)
    d.hosts = HostManager(discovery_script="echo localhost:2", cooldown_range=(2.0, 4.0))
    d._fill_slots = lambda: fills.append(-1)
    d.hosts.blacklist("localhost")
    clock[0] += 10
    d._after_cooldowns()
    assert -1 not in fills
