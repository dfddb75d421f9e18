"""A real single-node Slurm (Debian's slurm-wlm: slurmctld + slurmd, started
here as root with their own config, state and ports in a temporary folder)
runs gradflow jobs: plain ``srun --mpi=pmi2``, ``gradflowrun`` inside
``salloc`` (it picks srun itself) and ``sbatch``; rank placement must match
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, numbers match numpy, and a failing
rank is named. Skips, saying why, where Slurm is not installed or cannot
start (not root, daemons fail); scripts/slurm_check.sh installs it and runs
this module.
"""

import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from _launch import HERE, rank_env, run_cwd

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "salloc", "sbatch", "sinfo")
START_TIMEOUT = 60  # seconds for the node to show up idle
JOB_TIMEOUT = 180  # per job; each takes ~3 s on an idle machine
# The node claims 4 CPUs whatever the machine has (config_overrides), so 3
# ranks fit on a 2-core CI machine: MPICH yields while polling (rank_env).
NODE_CPUS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _conf(d: str, node: str) -> str:
    """slurm.conf for one node, no munge (auth/none: Slurm 22.05 still ships
    it) and no cgroups (containers often lack them). Job ids start at a random
    number: MPICH names its shared-memory segment (/dev/shm/mpich_shm_<world
    id>_<node>) from the PMI job name, Slurm's "<jobid>.<step>", and a segment
    a killed job left behind made the next run's job of the same id fail in
    MPI_Init (UCX "invalid bandwidth" / "Message truncated") while every
    run's ids started at 1."""
    ctl, slurmd = _free_port(), _free_port()
    first_job = random.randrange(10**6, 6 * 10**7)
    return f"""ClusterName=gradflowtest
FirstJobId={first_job}
SlurmctldHost={node}
SlurmctldPort={ctl}
SlurmdPort={slurmd}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={d}/plugstack.conf
NodeName={node} CPUs={NODE_CPUS} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _tail(path: str, n: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({e})"


@pytest.fixture(scope="module")
def slurm():
    """Start slurmctld and slurmd; yield the environment for client commands
    (SLURM_CONF and the gradflow test environment); stop both afterwards."""
    missing = [c for c in DAEMONS + CLIENTS if shutil.which(c) is None]
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} not on PATH); "
                    "apt-get install slurm-wlm, or run scripts/slurm_check.sh")
    if os.geteuid() != 0:
        pytest.skip("starting slurmd needs root (it launches tasks as their user)")
    d = tempfile.mkdtemp(prefix="gradflow-slurm-")
    for sub in ("state", "spool"):
        os.mkdir(os.path.join(d, sub))
    open(os.path.join(d, "plugstack.conf"), "w").close()
    node = socket.gethostname().split(".")[0]
    conf = os.path.join(d, "slurm.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(_conf(d, node))
    env = {k: v for k, v in rank_env().items() if not k.startswith("SLURM")}
    env["SLURM_CONF"] = conf
    procs = []
    try:
        # Foreground (-D) children of this process: stopped by pid, never by name.
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", conf], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["slurmd", "-D", "-N", node, "-f", conf], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline, state = time.monotonic() + START_TIMEOUT, ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True,
                               text=True, timeout=30)
            state = r.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        if state != "idle":
            pytest.skip(f"Slurm did not start (node state {state!r}; daemon exit codes "
                        f"{[p.poll() for p in procs]})\nslurmctld.log:\n"
                        f"{_tail(os.path.join(d, 'slurmctld.log'))}\nslurmd.log:\n"
                        f"{_tail(os.path.join(d, 'slurmd.log'))}")
        yield env
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=20)
        shutil.rmtree(d, ignore_errors=True)


def _run(env, *cmd, expect_fail=False) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, env=env, cwd=run_cwd(), capture_output=True, text=True,
                           timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out after {JOB_TIMEOUT} s\n"
                             f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}") from None
    assert (r.returncode != 0) == expect_fail, (
        f"{' '.join(cmd)} exited with {r.returncode}\nstdout:\n{r.stdout[-4000:]}\n"
        f"stderr:\n{r.stderr[-4000:]}")
    return r


GRADFLOWRUN = (sys.executable, "-m", "gradflow.runner.launch")
SCRIPT = os.path.join(HERE, "slurm_script.py")


def check_ranks(out: str, n: int) -> None:
    """slurm_script.py's lines: gradflow's rank/size/local_rank equal Slurm's,
    every rank present once, results identical bit for bit."""
    rows = re.findall(r"^(?:\[\d+\]<stdout>: )?placement (.*) sha (\w+)$", out, re.M)
    assert len(rows) == n, out
    seen = {}
    for fields, sha in rows:
        kv = dict(f.split("=") for f in fields.split())
        assert kv["rank"] == kv["SLURM_PROCID"] and kv["size"] == kv["SLURM_NTASKS"] == str(n), out
        assert kv["local_rank"] == kv["SLURM_LOCALID"] == kv["rank"], out  # one node
        assert kv["local_size"] == str(n), out
        seen[int(kv["rank"])] = sha
    assert sorted(seen) == list(range(n)), out
    assert len(set(seen.values())) == 1, out  # bitwise identical on every rank


@pytest.mark.parametrize("n", [2, 3])
def test_srun_pmi2(slurm, n):
    """Plain srun: the mpich wheel's MPI gets its world from Slurm's PMI-2."""
    r = _run(slurm, "srun", "-n", str(n), "--mpi=pmi2", sys.executable, SCRIPT)
    check_ranks(r.stdout, n)


def test_srun_without_pmi_is_singletons(slurm):
    """Why gradflowrun passes --mpi=pmi2: with MpiDefault=none (Slurm's
    default) each task is its own world of size 1, silently, so gradflow's
    init() checks for it."""
    r = _run(slurm, "srun", "-n", "2", "--mpi=none", sys.executable, "-c",
             "from mpi4py import MPI; print('world', MPI.COMM_WORLD.size)")
    assert r.stdout.split() == ["world", "1", "world", "1"], r.stdout
    # gradflow.init() refuses such a world on every task, naming the fix.
    r = _run(slurm, "srun", "-n", "2", "--mpi=none", sys.executable, "-c",
             "import gradflow; gradflow.init()", expect_fail=True)
    assert r.stderr.count("srun started 2 tasks but MPI sees a world of 1 on each") == 2, \
        r.stderr
    assert "srun --mpi=pmi2" in r.stderr, r.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_gradflowrun_in_salloc(slurm, n):
    """gradflowrun inside an allocation picks srun (auto) and asks for pmi2."""
    r = _run(slurm, "salloc", "-n", str(n), *GRADFLOWRUN, "-np", str(n), "--verbose",
             sys.executable, SCRIPT)
    assert re.search(r"gradflowrun: \S*srun --ntasks %d .*--mpi=pmi2" % n, r.stderr), r.stderr
    check_ranks(r.stdout, n)
    for rank in range(n):  # the rank prefix comes from SLURM_PROCID
        assert re.search(rf"^\[{rank}\]<stdout>: placement rank={rank} ", r.stdout, re.M)


def test_gradflowrun_in_sbatch(slurm, tmp_path):
    """A batch job: gradflowrun in the script, output in the job's file."""
    out = tmp_path / "job.out"
    cmd = shlex.join([*GRADFLOWRUN, "-np", "2", sys.executable, SCRIPT])
    _run(slurm, "sbatch", "--wait", "-n", "2", "-o", str(out), "--wrap", cmd)
    check_ranks(out.read_text(), 2)


def test_failing_rank_srun(slurm):
    """Plain srun: the survivor's collective raises naming the rank that raised
    (gradflow's in-band fail-fast, no launcher help); srun only reports the
    tasks' exit code (both exit 1, so it cannot tell which failed first)."""
    r = _run(slurm, "srun", "-n", "2", "--mpi=pmi2", sys.executable,
             os.path.join(HERE, "raising_rank_script.py"), expect_fail=True)
    m = re.search(r"^rank 0 raised after ([\d.]+) s: .*rank 1 failed: ValueError: boom on rank 1",
                  r.stdout, re.M)
    assert m and float(m.group(1)) < 30, r.stdout + r.stderr
    srun_says = r"srun: error: \S+: tasks? [-,0-9]+: Exited with exit code 1"
    assert re.search(srun_says, r.stderr), r.stderr


def test_failing_rank_gradflowrun_in_salloc(slurm):
    """gradflowrun under srun names the failed rank first."""
    r = _run(slurm, "salloc", "-n", "2", *GRADFLOWRUN, "-np", "2", sys.executable,
             os.path.join(HERE, "raising_rank_script.py"), expect_fail=True)
    assert re.search(r"^\[0\]<stdout>: rank 0 raised after [\d.]+ s: .*rank 1 failed: "
                     r"ValueError: boom on rank 1", r.stdout, re.M), r.stdout + r.stderr
    assert "gradflowrun: rank 1 exited with code 1" in r.stderr, r.stderr
    assert "gradflowrun: rank 1 failed first; rank(s) 0 failed after it" in r.stderr, r.stderr


def test_killed_rank_notice_in_salloc(slurm):
    """A SIGKILLed rank under srun: on one node the status folder is shared,
    so gradflowrun's failure notice reaches the survivor, which raises at once
    (otherwise it would wait GRADFLOW_TIMEOUT) naming the killed rank."""
    env = dict(slurm, GRADFLOW_TIMEOUT="300")
    t0 = time.monotonic()
    r = _run(env, "salloc", "-n", "2", *GRADFLOWRUN, "-np", "2", sys.executable,
             os.path.join(HERE, "sigkill_rank_script.py"), "1", "idle", expect_fail=True)
    assert time.monotonic() - t0 < 120, r.stdout + r.stderr
    assert re.search(r"^\[0\]<stdout>: rank 0 raised .*gradflowrun reports that rank 1 was "
                     r"killed by SIGKILL", r.stdout, re.M), r.stdout + r.stderr
    assert "gradflowrun: rank 1 exited with code 137 (SIGKILL)" in r.stderr, r.stderr

