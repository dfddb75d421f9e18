"""Shared helpers for the gradflow benchmarks: launching one MPI process
group per configuration (with a timeout), timing collectives, and formatting.

The benchmarks are driver + worker: the driver (run once, outside MPI) starts
one process group per system/mode with its own environment, because gradflow
reads its GRADFLOW_* settings at init(). Each worker group writes a JSON
result file that the driver merges into one table. With --netns the groups
run on the project's emulated cluster (benchmarks/cluster/), see
add_cluster_args / open_cluster.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cluster import Cluster, ClusterError, read_state  # noqa: E402


# ------------------------------------------------------------------ sizes

def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = 1
    for suffix, m in (("kib", 1 << 10), ("mib", 1 << 20), ("gib", 1 << 30), ("k", 1 << 10),
                      ("m", 1 << 20), ("g", 1 << 30), ("b", 1)):
        if s.endswith(suffix):
            s, mult = s[: -len(suffix)], m
            break
    return int(float(s) * mult)


def fmt_size(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n} B"


def fmt_time(t: Optional[float]) -> str:
    if t is None:
        return "—"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def busbw(nbytes: int, nranks: int, seconds: float) -> float:
    """Bus bandwidth in bytes/s: 2(N-1)/N * bytes / time (nccl-tests' definition)."""
    if nranks < 2 or not seconds:
        return 0.0
    return 2.0 * (nranks - 1) / nranks * nbytes / seconds


# ------------------------------------------------------------------ worker side

def mpi_rank_size():
    """Rank and size from the launcher's environment (MPICH hydra: PMI_*)."""
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("RANK", "WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def timed_iterations(comm, fn, iters: int, refill=None) -> List[float]:
    """Run `fn` `iters` times; each iteration is preceded by `refill` (not
    timed) and a barrier; its time is the slowest rank's (MPI MAX)."""
    import numpy as np
    from mpi4py import MPI
    times = np.zeros(iters)
    for i in range(iters):
        if refill is not None:
            refill()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times.tolist()


def iters_for(nbytes: int, max_iters: int, min_iters: int, budget_bytes: int) -> int:
    """Fewer iterations for big messages: about `budget_bytes` per size, within [min, max]."""
    return max(min_iters, min(max_iters, budget_bytes // max(nbytes, 1)))


# ------------------------------------------------------------------ driver side

def machine_info() -> Dict[str, object]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": socket.gethostname(), "cpus": os.cpu_count(), "loadavg": list(load),
            "python": platform.python_version(), "platform": platform.platform()}


def portable_path(p: object) -> object:
    """p as recorded in results, without this machine's layout: an absolute
    path in the project (or the project itself) relative to its root, any
    other absolute path relative to the root too (`../old-tree`), except the
    generic system folders (/tmp, /usr, ...), kept as they are. Non-strings
    and relative paths are returned unchanged. tests/single/test_no_machine_paths.py
    keeps committed files free of development-machine paths."""
    if not isinstance(p, str) or not os.path.isabs(p):
        return p
    if p == ROOT or p.startswith(ROOT + os.sep) or p.split(os.sep)[1] not in GENERIC_DIRS:
        return os.path.relpath(p, ROOT)
    return p


GENERIC_DIRS = ("tmp", "usr", "proc", "sys", "dev", "etc", "bin", "lib", "var", "opt")


def portable_cmd(cmd: Sequence[str]) -> str:
    """cmd as a shell line without this machine's paths (it is printed and
    recorded in results): files relative to the project root (portable_path),
    this interpreter as `python`, an mpiexec as `mpiexec`."""
    out = []
    for c in cmd:
        if c == sys.executable:
            c = "python"
        elif os.path.isabs(c) and os.path.basename(c) == "mpiexec":
            c = "mpiexec"
        else:
            c = portable_path(c)
        out.append(shlex.quote(c))
    return " ".join(out)


def venv_bin(name: str) -> str:
    cand = os.path.join(os.path.dirname(sys.executable), name)
    return cand if os.path.exists(cand) else name


# ------------------------------------------------------------------ emulated cluster

def add_cluster_args(p) -> None:
    """--netns and its options, the same in every benchmark driver."""
    p.add_argument("--netns", action="store_true",
                   help="run on the emulated cluster (benchmarks/cluster/, needs root): one network "
                        "namespace per rank; built for this run and removed after, unless --cluster names "
                        "one that is already up")
    p.add_argument("--rate", default="1gbit", help="with --netns: NIC rate of the cluster built (tc syntax)")
    p.add_argument("--delay", default="0", help="with --netns: added one-way latency (0, 500us, 1ms)")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="with --netns: use this running cluster (python -m benchmarks.cluster up N --name NAME)")


@contextmanager
def open_cluster(args, hosts: int) -> Iterator[Optional[Cluster]]:
    """The cluster for --netns (None without it): the running one named by
    --cluster, else one of `hosts` hosts built now and removed on exit."""
    if not getattr(args, "netns", False):
        yield None
        return
    if args.cluster:
        try:
            c = Cluster.attach(args.cluster)
        except ClusterError as e:
            sys.exit(f"--netns: {e}")
        if c.hosts < hosts:
            sys.exit(f"--netns: cluster {args.cluster!r} has {c.hosts} hosts, {hosts} needed")
        yield c
        return
    built = Cluster(hosts, args.rate, args.delay, name=f"bench{os.getpid()}")
    try:
        built.__enter__()
    except ClusterError as e:
        sys.exit(f"--netns: {e}")
    try:
        print(f"[bench] {built.describe()}", file=sys.stderr, flush=True)
        yield built
    finally:
        built.__exit__(None, None, None)


def launcher_prefix(nranks: int, cluster: Optional[Cluster] = None) -> List[str]:
    if cluster is not None:
        return cluster.mpi_command([], nranks)
    return [venv_bin("mpiexec"), "-n", str(nranks)]


def base_env(nranks: int, cluster: Optional[Cluster] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if nranks > (os.cpu_count() or 1):
        # MPICH busy-polls; with more ranks than cores yielding early helps a lot.
        env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    if cluster is not None:
        env = cluster.env(nranks, env)
    if glob.glob(os.path.join(ROOT, "gradflow", "_native*.so")):
        # A source tree with an in-place build is benchmarked as it stands.
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Never inherit gradflow settings from the caller: each run sets its own.
    for k in list(env):
        if k.startswith("GRADFLOW_"):
            del env[k]
    return env


def run_group(label: str, nranks: int, cluster: Optional[Cluster], worker_args: Sequence[str],
              extra_env: Dict[str, str], timeout: float, log=sys.stderr) -> Dict[str, object]:
    """Start one worker process group; return its JSON result, or an error record
    (command, exit status, tail of the output) when it fails, hangs or times out."""
    fd, out_json = tempfile.mkstemp(prefix="gfbench-", suffix=".json")
    os.close(fd)
    os.unlink(out_json)
    cmd = launcher_prefix(nranks, cluster) + [sys.executable] + list(worker_args) + ["--json-out", out_json]
    env = base_env(nranks, cluster)
    env.update(extra_env)
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items())
    print(f"[bench] {label}: {shown} {portable_cmd(cmd)}", file=log, flush=True)
    t0 = time.time()
    try:
        # own session so that a timeout kills the whole tree (mpiexec + ranks)
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            import signal
            if cluster is not None:  # hydra's proxies there are in sessions of their own
                cluster.kill_jobs(p)
            try:
                os.killpg(p.pid, signal.SIGTERM)
                time.sleep(2)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = p.communicate()
            rc = "timeout"
    except OSError as e:
        out, rc = str(e), "oserror"
    elapsed = time.time() - t0
    result: Dict[str, object] = {}
    if os.path.exists(out_json):  # the worker rewrites it after every size: partial results survive
        with open(out_json) as f:
            result = json.load(f)
    if rc != 0:
        tail = "\n".join((out or "").strip().splitlines()[-25:])
        result["error"] = f"exit status {rc}"
        result["output_tail"] = tail
        print(f"[bench] {label} FAILED ({rc}) after {elapsed:.0f}s:\n{tail}", file=log, flush=True)
    if os.path.exists(out_json):
        os.unlink(out_json)
    result["command"] = shown + " " + portable_cmd(cmd[:-2])
    result["wall_seconds"] = elapsed
    print(f"[bench] {label}: done in {elapsed:.0f}s", file=log, flush=True)
    return result


def script_cmdline() -> str:
    """This benchmark's command line, as the reports print it."""
    return "python " + portable_cmd([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


def rotated(names: Sequence[str], round_: int) -> List[str]:
    """`names` started at position round_ (mod len): the order of one round
    of an interleaved measurement, rotated each round so that load drift
    hits every name alike."""
    k = round_ % len(names)
    return list(names[k:]) + list(names[:k])


def run_interleaved(names: Sequence[str], repeat: int, start) -> Dict[str, List[object]]:
    """`repeat` rounds of one process group per name, the order rotated each
    round so that load drift hits every name alike. start(name, label)
    launches one group and returns its result; returns name -> results."""
    runs: Dict[str, List[object]] = {n: [] for n in names}
    for rep in range(repeat):
        for n in rotated(names, rep):
            runs[n].append(start(n, f"{n} (repetition {rep + 1}/{repeat})"))
    return runs


def noisy_medians(run_medians: Sequence[float]) -> Optional[str]:
    """'run medians vary LO .. HI (noisy machine)' when repetitions disagree
    by more than 1.5x, else None."""
    if len(run_medians) > 1 and max(run_medians) > 1.5 * min(run_medians):
        return (f"run medians vary {fmt_time(min(run_medians))} .. "
                f"{fmt_time(max(run_medians))} (noisy machine)")
    return None


# The collective benchmarks (allreduce_bench.py, compression_bench.py) are one
# script in two roles: the driver starts a process group of the same script
# with --worker per system or mode and merges the groups' --json-out files.

def add_driver_worker_args(p, json_help: str = "write all measurements here") -> None:
    """The options after a collective benchmark's own: the emulated cluster,
    a timeout per process group, the report files, and the hidden worker
    switches (a worker writes its result to --json-out)."""
    add_cluster_args(p)
    p.add_argument("--timeout", type=float, default=1200, help="seconds per process group")
    p.add_argument("--output", help="also write the markdown table here")
    p.add_argument("--json", help=json_help)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)


def driver_or_worker(args, worker, run_driver) -> None:
    """--worker: this process is one rank of a group, worker(args). Else the
    driver: run_driver(args, cluster) on the --netns emulated cluster (None:
    shared memory), taken down afterwards."""
    if args.worker:
        worker(args)
        return
    with open_cluster(args, args.np) as cluster:
        run_driver(args, cluster)


def finish_report(args, cluster, info, cmdline: str, text: str, problems: Sequence[str],
                  **measurements) -> None:
    """Print the report (text, then its problems), write it to --output, and
    write the run's meta and `measurements` to --json."""
    if problems:
        text += "\nProblems:\n" + "\n".join(problems) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": info | {"nranks": args.np, "netns": args.netns, "command": cmdline,
                                        "network": netns_config(cluster)},
                       **measurements}, f, indent=1)


def interrupt_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in a long sweep, so
    its finally: takes the emulated cluster down and it saves what it has."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def save_sweep_json(a, info, cmdline: str, status: str, **records) -> None:
    """A sweep's JSON file (a.json_out): machine, command, status ("partial"
    while it runs, so a killed sweep leaves its groups so far), arguments,
    then `records` (e.g. runs=[...])."""
    os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
    with open(a.json_out, "w") as f:
        json.dump({"machine": info, "command": cmdline, "status": status,
                   "args": {k: portable_path(v) for k, v in vars(a).items()}, **records}, f, indent=1)


def report_check_modes(name: str, ranks: int, steps: int, times: Dict[str, List[float]],
                       check: str, other: str, extra: Dict[str, float], extra_text: str) -> None:
    """Print the median ms/step of two interleaved modes and their ratio, and
    write every block to results/<name>-<ranks>.json (the hyperparameter
    check cost benchmarks)."""
    for mode, ts in times.items():
        print(f"{mode:>16}: {statistics.median(ts):.3f} ms/step (median of {len(ts)} blocks)")
    ratio = statistics.median(times[check]) / statistics.median(times[other])
    print(f"{check} / {other}: {ratio:.3f}; {extra_text}")
    with open(os.path.join(HERE, "results", f"{name}-{ranks}.json"), "w") as f:
        json.dump({"ranks": ranks, "steps_per_block": steps, "ms_per_step": times, **extra,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load_1min": os.getloadavg()[0]}, f, indent=1)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def netns_config(cluster: Optional[Cluster]) -> Optional[Dict[str, object]]:
    """The emulated cluster's settings (hosts, rate, delay, ...) for the JSON record."""
    if cluster is None:
        return None
    return {k: v for k, v in (read_state(cluster.name) or cluster.state).items()
            if k not in ("daemons", "owner_pid")}


def netns_desc(cluster: Optional[Cluster]) -> str:
    return cluster.describe() if cluster is not None else "shared memory (one machine)"


def write_doc_section(path: str, begin: str, end: str, section_body: str) -> None:
    """Write `begin` + section_body + `end` into the markdown file at `path`:
    replace the text between the markers if both are there, else append; the
    rest of the file (hand-written commentary included) is kept."""
    text = open(path).read() if os.path.exists(path) else ""
    section = f"{begin}\n{section_body}{end}\n"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        post = rest.split(end, 1)[1].lstrip("\n")
        text = pre + section + ("\n" + post if post else "")
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "# gradflow performance\n\n") + section
    with open(path, "w") as f:
        f.write(text)


def git_commit() -> str:
    """The commit the measured tree is at (plus '+dirty' with local changes)."""
    try:
        rev = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                      text=True, stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "native", "gradflow"],
                               stderr=subprocess.DEVNULL).returncode != 0
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record_result(name: str, payload: Dict[str, object], log_text: Optional[str] = None) -> str:
    """Write benchmarks/results/<name>.json (payload + command line, machine
    and commit) and, if given, the raw output as <name>.log. Docs quote these
    files, never pasted numbers."""
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    rec = {"command": portable_cmd([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
           "machine": machine_info(), "commit": git_commit(), **payload}
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    if log_text is not None:
        with open(os.path.join(out_dir, name + ".log"), "w") as f:
            f.write(log_text)
    print(f"wrote {os.path.relpath(path, ROOT)}", flush=True)
    return path
