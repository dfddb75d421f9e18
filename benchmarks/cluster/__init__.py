"""gradflow's emulated cluster: N "hosts" on one Linux machine, each a network
namespace with one NIC of a set rate (and optional one-way delay), joined by a
bridge, with MPI ranks started inside them over TCP. The benchmarks and the
multi-host tests use it; `python -m benchmarks.cluster` is its command line
(see README.md here).

    from benchmarks.cluster import Cluster
    with Cluster(4, rate="1gbit", delay="0", name="mybench") as c:
        c.run(["python", "benchmarks/allreduce_bench.py", ...], timeout=600)

The `Cluster` object owns what it builds: leaving the `with` block, an
exception, Ctrl-C, SIGTERM/SIGHUP or interpreter exit removes it.
Needs root and iproute2 (plus iptables for a delay on kernels without netem);
`unavailable_reason()` says what is missing. This package owns naming, the
life cycle and the rank environment; _topology.py builds the network.
"""
from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence

from ._topology import (IFACE, ClusterError, build, check_name, host_ns, kill_pids,  # noqa: F401
                        list_clusters, namespace_pids, read_state, switch_ns, teardown,
                        unavailable_reason)

HERE = os.path.dirname(os.path.abspath(__file__))
RSH = os.path.join(HERE, "rsh")
CLI = os.path.join(HERE, "__main__.py")

__all__ = ["Cluster", "ClusterError", "IFACE", "unavailable_reason", "list_clusters", "teardown"]


def mpiexec() -> str:
    """The mpiexec beside this interpreter (the `mpich` wheel in a venv), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if not found:
        raise ClusterError("mpiexec not found (install the `mpich` wheel in this Python's venv)")
    return found


class Cluster:
    """An emulated cluster of `hosts` hosts with a `rate` NIC each (tc syntax,
    'none' = unlimited) and `delay` added one-way latency ('0', '500us').

    `name` (1-20 lowercase letters/digits) keys the namespaces
    gradflow-<name>-sw / -h<k> and the state in /run/gradflow-cluster/<name>;
    different names never interfere. `up()` rebuilds a cluster of that name.
    """

    def __init__(self, hosts: int, rate: str = "1gbit", delay: str = "0", name: str = "default",
                 mtu: int = 1500):
        self.name = check_name(name)
        self.hosts, self.rate, self.delay, self.mtu = int(hosts), rate, delay, mtu
        self.state: Dict = {}
        self._owned = False
        self._old_handlers: Dict[int, object] = {}

    # -------------------------------------------------------------- life cycle
    @classmethod
    def attach(cls, name: str = "default") -> "Cluster":
        """The running cluster `name` (built by someone else; not removed by us)."""
        state = read_state(check_name(name))
        if not state or not state.get("complete"):
            raise ClusterError(f"no emulated cluster {name!r} is up "
                               f"(python -m benchmarks.cluster up N --name {name})")
        c = cls(state["hosts"], state["rate"], state["delay"], name, state["mtu"])
        c.state = state
        return c

    def up(self) -> "Cluster":
        self.state = build(self.name, self.hosts, self.rate, self.delay, self.mtu)
        self._owned = True
        atexit.register(self.down)
        return self

    def down(self) -> None:
        """Remove the cluster if this object built it (idempotent)."""
        if self._owned:
            self._owned = False
            atexit.unregister(self.down)
            teardown(self.name)

    def __enter__(self) -> "Cluster":
        # SIGTERM/SIGHUP would end the process without running `finally`:
        # turn them into SystemExit while we own namespaces.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old_handlers[sig] = signal.signal(sig, _exit_on_signal)
        try:
            return self.up()
        except BaseException:
            self._restore_handlers()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # -------------------------------------------------------------- addresses
    @property
    def subnet(self) -> str:
        return self.state.get("subnet", "10.213.0")

    def host_ns(self, k: int) -> str:
        return host_ns(self.name, k)

    def host_ip(self, k: int) -> str:
        return f"{self.subnet}.{k + 1}"

    @property
    def switch_ns(self) -> str:
        return switch_ns(self.name)

    @property
    def switch_ip(self) -> str:
        return f"{self.subnet}.254"

    def describe(self) -> str:
        s = self.state
        return (f"emulated cluster {self.name!r}: {s.get('hosts')} hosts (network namespaces), "
                f"{s.get('rate')} per NIC full duplex, added one-way delay {s.get('delay')} "
                f"({s.get('delay_mode')}), MPICH over ofi/tcp")

    # -------------------------------------------------------------- running
    def _check_n(self, n: Optional[int]) -> int:
        n = self.hosts if n is None else int(n)
        if not 1 <= n <= self.hosts:
            raise ClusterError(f"{n} hosts asked for, cluster {self.name!r} has {self.hosts}")
        return n

    def env(self, n: Optional[int] = None, base: Optional[Dict[str, str]] = None,
            ranks: Optional[int] = None) -> Dict[str, str]:
        """Environment for a job on the first n hosts (`ranks` MPI ranks in all)."""
        n = self._check_n(n)
        env = dict(os.environ if base is None else base)
        env.update(GFCLUSTER_NAME=self.name, GFCLUSTER_IFACE=IFACE,
                   GFCLUSTER_RATE=str(self.state.get("rate")),
                   GFCLUSTER_DELAY=str(self.state.get("delay")),
                   MASTER_ADDR=self.host_ip(0), GLOO_SOCKET_IFNAME=IFACE, TP_SOCKET_IFNAME=IFACE,
                   # MPICH on TCP through the emulated NIC
                   MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE=IFACE,
                   # libfabric tcp's default inject size (128 B) makes every
                   # blocking send > 128 B wait a full round trip.
                   FI_TCP_MAX_INJECT="65536")
        if (ranks or n) <= n:
            # One rank per host: never MPICH shared memory (namespaces share a
            # kernel, so shm would bypass the link). With several ranks per
            # host they share memory as on a real node (hydra groups ranks by
            # proxy, one proxy per host), and local_size stays right.
            env["MPIR_CVAR_NOLOCAL"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        if (ranks or n) > (os.cpu_count() or 1):
            # more ranks than cores: MPICH busy-polls; yielding early made
            # small messages ~4x faster
            env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
        return env

    def mpi_command(self, argv: Sequence[str], n: Optional[int] = None, ppn: int = 1,
                    mpi_args: Sequence[str] = ()) -> List[str]:
        """mpiexec in the switch namespace starting ppn ranks on each of the
        first n hosts, through the rsh launcher."""
        n = self._check_n(n)
        hosts = ",".join(self.host_ip(k) for k in range(n))
        return ["ip", "netns", "exec", self.switch_ns, mpiexec(), "-launcher", "rsh",
                "-launcher-exec", RSH, "-localhost", self.switch_ip, "-hosts", hosts,
                "-ppn", str(ppn), "-n", str(n * ppn), *mpi_args, *argv]

    def command(self, argv: Sequence[str], n: Optional[int] = None, raw: bool = False) -> List[str]:
        """One command line that runs argv on the first n hosts: MPI ranks, or
        with raw=True one process per host with torch.distributed's env://
        variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
        if not raw:
            return self.mpi_command(argv, n)
        n = self._check_n(n)
        return [sys.executable, CLI, "run", "--name", self.name, "--raw", str(n), "--", *argv]

    def host_command(self, k: int, argv: Sequence[str]) -> List[str]:
        """argv run inside host k (its network and hostname)."""
        return [RSH, self.host_ns(k), shlex.join(argv)]

    def run(self, argv: Sequence[str], n: Optional[int] = None, raw: bool = False,
            timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
            **popen_kwargs) -> subprocess.CompletedProcess:
        """Run argv on the first n hosts and wait (at most `timeout` seconds:
        then every job process in the cluster is killed and TimeoutExpired raised)."""
        n = self._check_n(n)
        return self.run_command(self.command(argv, n, raw), env=self.env(n, env), timeout=timeout,
                                **popen_kwargs)

    def run_command(self, cmd: Sequence[str], env: Optional[Dict[str, str]] = None,
                    timeout: Optional[float] = None, capture: bool = True,
                    **popen_kwargs) -> subprocess.CompletedProcess:
        """Run a command line built with command()/host_command() (text output
        captured unless capture=False); on timeout or interruption end every
        job process in the cluster, then re-raise."""
        if capture:
            popen_kwargs.setdefault("stdout", subprocess.PIPE)
            popen_kwargs.setdefault("stderr", subprocess.PIPE)
            popen_kwargs.setdefault("text", True)
        p = subprocess.Popen(list(cmd), env=env, start_new_session=True, **popen_kwargs)
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException:
            self.kill_jobs(p)
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def job_pids(self) -> List[int]:
        """Processes in the cluster's namespaces other than its delay daemons."""
        daemons = set(self.state.get("daemons", {}).values())
        nss = [self.switch_ns] + [self.host_ns(k) for k in range(self.hosts)]
        return [p for ns in nss for p in namespace_pids(ns) if p not in daemons]

    def kill_jobs(self, p: Optional[subprocess.Popen] = None) -> None:
        """End a job: its process group, and everything it started in our
        namespaces (hydra proxies run in sessions of their own)."""
        if p is not None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        kill_pids(self.job_pids(), grace=2.0)
        if p is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)
