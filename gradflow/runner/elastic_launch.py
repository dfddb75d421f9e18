"""gradflowrun's elastic flags (horovodrun's spellings) and the elastic
launch: what is checked before anything starts, the environment workers
get, and the hand-over to ElasticDriver (elastic_driver.py)."""
from __future__ import annotations

import argparse
import ipaddress
import shlex
import socket
import subprocess
from typing import Dict, List, Optional

try:
    from . import hosts as _hosts
    from .elastic_driver import ElasticDriver
    from .elastic_hosts import HostManager, parse_cooldown
except ImportError:  # run as a script
    import hosts as _hosts  # type: ignore[no-redef]
    from elastic_driver import ElasticDriver  # type: ignore[no-redef]
    from elastic_hosts import HostManager, parse_cooldown  # type: ignore[no-redef]


ELASTIC_TIMEOUT_DEFAULT = 600.0


def add_elastic_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("elastic training (docs/elastic.md; any of these but "
                             "--elastic-timeout turns it on)")
    g.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                   help="fewest workers to train with; below it for --elastic-timeout the job "
                        "ends (default: -np)")
    g.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                   help="most workers to use; extra slots stay idle (default: -np)")
    g.add_argument("--slots-per-host", dest="slots_per_host", type=int, metavar="N",
                   help="slots of a host the discovery script prints without ':slots'")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="executable printing the usable hosts, one 'host:slots' per line; run "
                        "every second")
    g.add_argument("--elastic-timeout", type=float, default=None, metavar="S",
                   help="seconds to wait for enough workers / a rendezvous "
                        f"(default {ELASTIC_TIMEOUT_DEFAULT:g})")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="end the job after more than N resets caused by failures (default: "
                        "no limit)")
    g.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("LOW", "HIGH"),
                   help="a failed host may come back after LOW s, doubling per failure up to "
                        "HIGH s (default: blacklisted for the rest of the job)")


def is_elastic(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in
               ("min_np", "max_np", "host_discovery_script", "reset_limit",
                "blacklist_cooldown_range", "slots_per_host"))


def check_elastic(args: argparse.Namespace) -> HostManager:
    """Validate the elastic options (ValueError with the user's message);
    fills args.np/min_np/max_np; returns the host manager."""
    if not args.command:
        raise ValueError("no command given, e.g. gradflowrun --min-np 2 --max-np 4 "
                         "--host-discovery-script ./hosts.sh python train.py")
    if args.command[0].startswith("-"):
        raise ValueError(f"unknown gradflowrun option {args.command[0]!r} "
                         "(options go before the command)")
    if args.np is None and args.min_np is None:
        raise ValueError("elastic mode needs -np or --min-np")
    np_ = args.np if args.np is not None else args.min_np
    min_np = args.min_np if args.min_np is not None else np_
    max_np = args.max_np if args.max_np is not None else max(np_, min_np)
    if not 1 <= min_np <= np_ <= max_np:
        raise ValueError(f"elastic mode needs 1 <= --min-np ({min_np}) <= -np ({np_}) <= "
                         f"--max-np ({max_np})")
    args.np, args.min_np, args.max_np = np_, min_np, max_np
    if args.elastic_timeout is None:
        args.elastic_timeout = ELASTIC_TIMEOUT_DEFAULT
    if not args.elastic_timeout > 0:
        raise ValueError(f"--elastic-timeout must be > 0, got {args.elastic_timeout}")
    if args.reset_limit is not None and args.reset_limit < 0:
        raise ValueError(f"--reset-limit must be >= 0, got {args.reset_limit}")
    if args.slots_per_host is not None and args.slots_per_host < 1:
        raise ValueError(f"--slots-per-host must be >= 1, got {args.slots_per_host}")
    cooldown = parse_cooldown(args.blacklist_cooldown_range)
    for flag, value in (("--monitor", getattr(args, "monitor", None)),
                        ("--output-filename", args.output_filename)):
        if value is not None:
            raise ValueError(f"{flag} is not supported in elastic mode yet (docs/elastic.md)")
    if args.launcher not in ("auto", "mpiexec"):
        raise ValueError(f"elastic mode starts workers with MPICH's mpiexec; --launcher "
                         f"{args.launcher} is not supported there")
    script = args.host_discovery_script
    if script is not None and (args.hosts or args.hostfile):
        raise ValueError("give either -H/--hostfile or --host-discovery-script, not both")
    if script is not None:
        return HostManager(discovery_script=script, slots_per_host=args.slots_per_host,
                           cooldown_range=cooldown)
    if args.hosts:
        static = {h.name: h.slots for h in _hosts.parse_hosts(args.hosts)}
    elif args.hostfile:
        static = {h.name: h.slots for h in _hosts.read_hostfile(args.hostfile)}
    else:
        static = {"localhost": max_np}
    return HostManager(static=static, cooldown_range=cooldown)


def advertised_address(iface: Optional[str], hosts: HostManager) -> str:
    """The address workers reach the driver at: the interface's IPv4 address
    if one was named, 127.0.0.1 when every known host is this one, else the
    source address of the route towards the first other host."""
    if iface:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", iface],
                             capture_output=True, text=True).stdout.split()
        if "inet" in out:
            return out[out.index("inet") + 1].split("/")[0]
        raise ValueError(f"--network-interface {iface}: no IPv4 address found")
    others = [h for h in hosts.discover() if not _hosts.is_local_host(h)]
    if not others:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(others[0]), 9))
        addr = s.getsockname()[0]
    ipaddress.ip_address(addr)
    return addr


def worker_env(env: Dict[str, str]) -> Dict[str, str]:
    """Elastic workers talk through UCX over TCP: after a peer dies,
    libfabric's tcp provider (ofi) blocks the survivor inside MPI_Test
    retrying the dead connection, so it could never re-form; UCX returns and
    lets it go on (docs/elastic.md)."""
    env = dict(env)
    env["MPIR_CVAR_CH4_NETMOD"] = "ucx"
    # UCX's shared-memory transports crashed (SIGSEGV in MPI_Comm_accept)
    # in processes that had imported torch; TCP (and self) did not.
    env.setdefault("UCX_TLS", "tcp,self")
    # Requests abandoned with a dead peer's communicator make UCX print one
    # "was not returned to mpool" warning each at exit.
    env.setdefault("UCX_LOG_LEVEL", "error")
    iface = env.get("FI_TCP_IFACE")
    if iface and not env.get("UCX_NET_DEVICES"):
        env["UCX_NET_DEVICES"] = iface
    return env


def run_elastic(args: argparse.Namespace, hosts: HostManager, env: Dict[str, str],
                mpiexec: str) -> int:
    driver = ElasticDriver(
        args.command, worker_env(env), hosts, np=args.np, min_np=args.min_np,
        max_np=args.max_np, elastic_timeout=args.elastic_timeout, reset_limit=args.reset_limit,
        start_timeout=args.start_timeout, mpiexec=mpiexec,
        mpi_args=shlex.split(args.mpi_args or ""),
        advertise=advertised_address(args.network_interface, hosts), verbose=args.verbose)
    return driver.run()


__all__: List[str] = ["add_elastic_flags", "is_elastic", "check_elastic", "run_elastic"]
