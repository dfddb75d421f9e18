"""Command line of the emulated cluster (run from the project root, as root):

    python -m benchmarks.cluster up 4 --rate 1gbit --delay 0     # build (rebuild) cluster "default"
    python -m benchmarks.cluster run 4 -- python benchmarks/allreduce_bench.py --worker ...
    python -m benchmarks.cluster run 2 --raw -- python ddp_script.py   # torch env://, no mpiexec
    python -m benchmarks.cluster check                           # measure the link between 2 hosts
    python -m benchmarks.cluster status                          # clusters of this harness
    python -m benchmarks.cluster down                            # remove it (idempotent)

--name NAME (default "default") picks one of several independent clusters.
`run` exits with the job's status; `--timeout S` kills the job after S seconds.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

if __package__ in (None, ""):  # started by path (Cluster.command's raw mode): be the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    __package__ = "benchmarks.cluster"

from . import Cluster, ClusterError, list_clusters, teardown  # noqa: E402


def cmd_up(a) -> int:
    c = Cluster(a.hosts, a.rate, a.delay, a.name, a.mtu)
    c.up()
    c._owned = False  # the CLI leaves it up for later `run`s; `down` removes it
    print(f"up: {c.describe()}; hosts "
          + " ".join(f"{c.host_ns(k)}={c.host_ip(k)}" for k in range(c.hosts)))
    return 0


def cmd_down(a) -> int:
    names = [n for n, s in list_clusters().items() if a.all or n == a.name]
    for name in names:
        gone = teardown(name)
        print(f"down: cluster {name!r}" + (f" ({len(gone)} namespaces deleted)" if gone else ""))
    return 0


def cmd_status(a) -> int:
    found = list_clusters()
    if not found:
        print("no emulated clusters")
    for name, s in sorted(found.items()):
        if not s:
            print(f"{name}: namespaces without state (half-built or left over): "
                  f"python -m benchmarks.cluster down --name {name}")
            continue
        owner = s.get("owner_pid")
        alive = owner and os.path.exists(f"/proc/{owner}")
        print(f"{name}: {s['hosts']} hosts, rate {s['rate']}, "
              f"delay {s['delay']} ({s['delay_mode']}), "
              f"subnet {s['subnet']}.0/24, built {s['created']} by pid {owner}"
              f"{'' if alive else ' (since exited)'}{'' if s.get('complete') else ', INCOMPLETE'}")
    return 0


def cmd_run(a) -> int:
    if not a.command:
        raise ClusterError("no command given (run N -- CMD ...)")
    c = Cluster.attach(a.name)
    n = a.hosts
    if a.raw:
        return _run_raw(c, n, a.command, a.timeout)
    env = c.env(n, ranks=n * a.ppn)
    cmd = c.mpi_command(a.command, n, a.ppn, shlex.split(a.mpi_args or ""))
    if a.timeout:
        cmd = ["timeout", "--kill-after=10", str(a.timeout)] + cmd
    os.execvpe(cmd[0], cmd, env)


def _run_raw(c: Cluster, n: int, argv, timeout) -> int:
    """One process per host with torch.distributed's env:// variables; the
    status is the worst of theirs. On a signal or timeout all are ended."""
    base = c.env(n)
    base.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE="1", LOCAL_RANK="0",
                MASTER_PORT=os.environ.get("MASTER_PORT", str(29500 + os.getpid() % 20000)))
    procs = []

    def stop(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        for k in range(n):
            env = dict(base, RANK=str(k), GROUP_RANK=str(k), NODE_RANK=str(k))
            procs.append(subprocess.Popen(c.host_command(k, argv), env=env))
        deadline = time.monotonic() + timeout if timeout else None
        rc = 0
        for p in procs:
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            try:
                code = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                print(f"cluster run: timeout after {timeout}s, ending the job", file=sys.stderr)
                return 124
            rc = rc or code
        return rc
    finally:
        if any(p.poll() is None for p in procs):
            c.kill_jobs()


def cmd_check(a) -> int:
    """2-host link check: MPI ping-pong and streaming bandwidth (linkcheck.py)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "linkcheck.py")
    argv = [sys.executable, script, "--stream-mib", str(a.stream_mib), "--reps", str(a.reps)]
    if a.name_given:
        c = Cluster.attach(a.name)
        print(c.describe(), flush=True)
        return c.run(argv, n=2, timeout=600, capture=False).returncode
    with Cluster(2, a.rate, a.delay, a.name) as c:
        print(c.describe(), flush=True)
        return c.run(argv, n=2, timeout=600, capture=False).returncode


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)

    def named(sp, default="default"):
        sp.add_argument("--name", default=default, help=f"cluster name (default {default!r})")
        return sp
    up = named(sub.add_parser("up", help="build (or rebuild) a cluster and leave it up"))
    up.add_argument("hosts", type=int)
    up.add_argument("--rate", default="1gbit", help="per NIC, each direction: 1gbit, 500mbit, none")
    up.add_argument("--delay", default="0", help="added one-way latency: 0, 200us, 1ms")
    up.add_argument("--mtu", type=int, default=1500)
    down = named(sub.add_parser("down", help="remove a cluster (idempotent)"))
    down.add_argument("--all", action="store_true",
                      help="every cluster of this harness here (also ones others built)")
    named(sub.add_parser("status", help="list the clusters of this harness"))
    run = named(sub.add_parser("run", help="run a command on the first N hosts"))
    run.add_argument("hosts", type=int)
    run.add_argument("--raw", action="store_true", help="one process per host, torch env:// style")
    run.add_argument("--ppn", type=int, default=1, help="MPI ranks per host")
    run.add_argument("--mpi-args", default="", help="extra mpiexec arguments (one string)")
    run.add_argument("--timeout", type=float, default=None, help="seconds; then the job is killed")
    run.add_argument("command", nargs="*", help="after --: the command (its options are its own)")
    check = sub.add_parser("check", help="measure the link between 2 hosts")
    check.add_argument("--name", default=None,
                       help="use this running cluster (default: build a temporary 2-host one)")
    check.add_argument("--rate", default="1gbit")
    check.add_argument("--delay", default="0")
    check.add_argument("--stream-mib", type=int, default=64)
    check.add_argument("--reps", type=int, default=5)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # everything after -- is the command
    a = p.parse_args(argv[:cut])
    if a.what == "run":
        a.command = a.command + argv[cut + 1:]
    if a.what == "check":
        a.name_given = a.name is not None
        a.name = a.name or f"check{os.getpid()}"
    try:
        rc = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "run": cmd_run,
              "check": cmd_check}[a.what](a)
    except ClusterError as e:
        sys.exit(f"cluster: {e}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
