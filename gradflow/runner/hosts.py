"""Host lists for gradflowrun: parse ``-H host:slots,...`` and hostfiles, and
map ranks to hosts. Pure functions, standard library only; must not start
processes or import the native module.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from typing import Callable, Iterable, List, Sequence

__all__ = [
    "HostSlots",
    "check_host_name",
    "parse_hosts",
    "parse_hostfile",
    "read_hostfile",
    "rank_to_host",
    "hydra_hosts_arg",
    "is_local_host",
    "merge_local_aliases",
]


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks (slots) it may run."""

    name: str
    slots: int


def _parse_slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise ValueError(f"{where}: slots must be an integer, got {text!r}") from None
    if slots < 1:
        raise ValueError(f"{where}: slots must be >= 1, got {slots}")
    return slots


def _check_unique(hosts: Sequence[HostSlots], where: str) -> List[HostSlots]:
    seen = set()
    for h in hosts:
        if h.name in seen:
            raise ValueError(f"{where}: host {h.name!r} is listed twice; give it once with "
                             "the total number of slots")
        seen.add(h.name)
    if not hosts:
        raise ValueError(f"{where}: no hosts given")
    return list(hosts)


# Letters, digits, '.', '_' and '-' (DNS names, IPv4 addresses, /etc/hosts
# aliases), not starting with '-' or '.': a name reaches ssh's and hydra's
# argv, where "-oProxyCommand=..." would be taken as an option.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def check_host_name(name: str, where: str) -> str:
    """Return ``name`` if it is a plausible host name; raise ValueError otherwise."""
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(f"{where}: bad host name {name!r}: use letters, digits, '.', '_' and "
                         "'-', not starting with '-' or '.'")
    return name


def _parse_entry(entry: str, where: str) -> HostSlots:
    """``host``, ``host:N`` (one entry of -H or a hostfile line ``host:N``)."""
    name, sep, slots = entry.rpartition(":")
    if not sep:
        name, slots = entry, "1"
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"{where}: bad host entry {entry!r}; expected host or host:slots")
    return HostSlots(check_host_name(name, where), _parse_slots(slots, where))


def parse_hosts(spec: str) -> List[HostSlots]:
    """Parse ``-H h1:2,h2:2`` (a host without ``:N`` has 1 slot)."""
    entries = [e.strip() for e in spec.split(",")]
    if not spec.strip() or any(not e for e in entries):
        raise ValueError(f"-H {spec!r}: expected a comma-separated list host:slots,...")
    return _check_unique([_parse_entry(e, f"-H {spec!r}") for e in entries], f"-H {spec!r}")


def parse_hostfile(lines: Iterable[str], source: str = "hostfile") -> List[HostSlots]:
    """Parse hostfile lines: ``host slots=N``, ``host:N`` or ``host``.

    Blank lines and ``#`` comments are ignored. Raises ValueError naming the
    line for anything else.
    """
    hosts = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        fields = line.split()
        if len(fields) == 1:
            hosts.append(_parse_entry(fields[0], where))
        elif len(fields) == 2 and fields[1].startswith("slots="):
            if ":" in fields[0]:
                raise ValueError(f"{where}: give slots either as host:N or slots=N, not both")
            hosts.append(HostSlots(check_host_name(fields[0], where),
                                   _parse_slots(fields[1][len("slots="):], where)))
        else:
            raise ValueError(f"{where}: cannot parse {raw.strip()!r}; expected "
                             "'host slots=N' or 'host:N'")
    return _check_unique(hosts, source)


def read_hostfile(path: str) -> List[HostSlots]:
    """Read and parse a hostfile (see parse_hostfile)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_hostfile(f, source=path)
    except OSError as e:
        raise ValueError(f"--hostfile {path}: {e.strerror}") from None


def rank_to_host(hosts: Sequence[HostSlots], np: int) -> List[str]:
    """Block mapping: fill each host's slots in order. ``result[rank]`` is its host.

    Raises ValueError when the hosts have fewer slots than ``np`` (use more
    hosts or slots; gradflowrun does not oversubscribe listed hosts).
    """
    if np < 1:
        raise ValueError(f"-np must be >= 1, got {np}")
    total = sum(h.slots for h in hosts)
    if total < np:
        listed = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        raise ValueError(f"-np {np} needs {np} slots but the hosts ({listed}) have only "
                         f"{total}")
    mapping: List[str] = []
    for h in hosts:
        mapping.extend([h.name] * min(h.slots, np - len(mapping)))
    return mapping


def hydra_hosts_arg(hosts: Sequence[HostSlots], np: int) -> str:
    """Hydra ``-hosts`` value for the first ``np`` slots, e.g. ``h1:2,h2:1``.

    Only the hosts that get ranks are listed, with the slots they use, so
    hydra's placement is exactly rank_to_host's.
    """
    mapping = rank_to_host(hosts, np)
    used = []
    for h in hosts:
        n = mapping.count(h.name)
        if n:
            used.append(f"{h.name}:{n}")
    return ",".join(used)


def _is_local_address(family: int, sockaddr: tuple) -> bool:
    """True for a loopback address or one assigned to an interface here (the
    kernel lets a socket bind only to those)."""
    if ipaddress.ip_address(sockaddr[0].split("%")[0]).is_loopback:
        return True
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind(sockaddr)
        return True
    except OSError:
        return False


def is_local_host(name: str) -> bool:
    """True when ``name`` designates this machine: localhost, its host name,
    or a name or address that resolves to a loopback address or to one of
    this machine's interface addresses (e.g. 127.0.1.1 or its LAN IP)."""
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_UDP)
    except (OSError, UnicodeError):
        return False
    return any(_is_local_address(family, sockaddr) for family, _, _, _, sockaddr in infos)


def merge_local_aliases(hosts: Sequence[HostSlots],
                        is_local: Callable[[str], bool] = is_local_host) -> List[HostSlots]:
    """One entry for all the names of this machine, at the first one's place
    with their slots summed; other hosts unchanged.

    Hydra starts one proxy per listed name, and MPICH's shared-memory split
    (local_rank, local_size) follows the proxies: ``-H localhost:2,127.0.0.1:1``
    gave two processes on this machine local_rank 0 (one GPU for both under
    ``torch.cuda.set_device(local_rank())``). Open MPI's mpirun, which
    horovodrun uses, likewise folds the local node's aliases into one node.
    Other machines' aliases are not detected (that would need every host's
    addresses); a host listed twice under one name is refused by the parsers.
    """
    merged: List[HostSlots] = []
    first_local = None
    for h in hosts:
        if is_local(h.name):
            if first_local is None:
                first_local = len(merged)
                merged.append(h)
            else:
                kept = merged[first_local]
                merged[first_local] = HostSlots(kept.name, kept.slots + h.slots)
            continue
        merged.append(h)
    return merged
