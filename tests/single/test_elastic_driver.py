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
