"""Builds and removes one emulated cluster: network namespaces, the bridge
"switch", one shaped NIC per host, the optional delay daemons, and the state
file that records all of it.

Layout of a cluster called NAME with N hosts (nothing is created in the root
namespace, so a cluster never touches the machine's own network):

    gradflow-NAME-hK   one namespace per host, NIC `gfnet0` = SUBNET.(K+1)/24
         |  veth pair
    gradflow-NAME-sw   the switch: bridge `gfbr0` = SUBNET.254, port `gfpK`
                       per host; mpiexec runs here (like a login node)

Rate: a token bucket (tbf) on the host's NIC (uplink) and one on the switch
port towards it (downlink), i.e. a full-duplex NIC of RATE. Delay: netem on
the downlink where the kernel has it, else an NFQUEUE rule on the host's
ingress served by _delayd.py (kernels built without sch_netem). Either way a
packet is delayed once per hop host -> host, so DELAY is the one-way latency.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
DELAYD = os.path.join(HERE, "_delayd.py")
STATE_ROOT = "/run/gradflow-cluster"
NS_PREFIX = "gradflow-"          # every namespace we create starts with this
IFACE = "gfnet0"                 # the host's NIC (inside its namespace)
BRIDGE = "gfbr0"
DEFAULT_SUBNET = "10.213.0"      # only ever configured inside our own namespaces
MAX_HOSTS = 64
_NAME_RE = re.compile(r"^[a-z0-9]{1,20}$")


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built, found or used (the message says why)."""


# ------------------------------------------------------------------ names and checks

def check_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise ClusterError(f"cluster name {name!r}: use 1-20 lowercase letters or digits")
    return name


def switch_ns(name: str) -> str:
    return f"{NS_PREFIX}{name}-sw"


def host_ns(name: str, k: int) -> str:
    return f"{NS_PREFIX}{name}-h{k}"


def state_dir(name: str) -> str:
    return os.path.join(STATE_ROOT, name)


def unavailable_reason(delay: bool = False) -> Optional[str]:
    """Why a cluster cannot be built here (None if it can): tests skip with this."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building the emulated cluster needs root (network namespaces)"
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if not shutil.which(tool):
            return f"`{tool}` not found (apt-get install -y {pkg})"
    if delay and not _iptables():
        return "an added delay needs iptables here (apt-get install -y iptables)"
    return None


def _iptables() -> Optional[str]:
    # the legacy backend needs only xt_NFQUEUE; the nft one also nft_queue
    return shutil.which("iptables-legacy") or shutil.which("iptables")


def parse_rate(s: str) -> int:
    """tc rate ('1gbit', '500mbit', '100mbps', 'none') -> bits/s (0 = no limit)."""
    s = str(s).strip().lower()
    if s in ("", "none", "off", "0"):
        return 0
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?)(bit|bps)", s)
    if not m:
        raise ClusterError(f"rate {s!r}: use tc syntax such as 1gbit, 500mbit or none")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return int(float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1))


def parse_delay(s: str) -> float:
    """One-way delay ('0', '500us', '1ms', '0.002s') -> microseconds."""
    s = str(s).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(us|ms|s)?", s)
    if not m or (m.group(2) is None and float(m.group(1)) != 0):
        raise ClusterError(f"delay {s!r}: use 0, 500us, 1ms, ...")
    return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6, None: 0}[m.group(2)]


# ------------------------------------------------------------------ small runners

def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def existing_namespaces() -> List[str]:
    r = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def namespace_pids(ns: str) -> List[int]:
    r = _sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()]


def kill_pids(pids: List[int], grace: float = 1.0) -> None:
    """SIGTERM, then SIGKILL what is still there after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone once reaped
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


# ------------------------------------------------------------------ state

def read_state(name: str) -> Optional[Dict]:
    try:
        with open(os.path.join(state_dir(name), "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_state(state: Dict) -> None:
    d = state_dir(state["name"])
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(d, "state.json"))


def list_clusters() -> Dict[str, Dict]:
    """{name: state or {} when only namespaces are left} for every cluster of this harness."""
    found: Dict[str, Dict] = {}
    for ns in existing_namespaces():
        m = re.fullmatch(re.escape(NS_PREFIX) + r"([a-z0-9]+)-(sw|h[0-9]+)", ns)
        if m:
            found.setdefault(m.group(1), {})
    if os.path.isdir(STATE_ROOT):
        for name in os.listdir(STATE_ROOT):
            if _NAME_RE.match(name):
                found.setdefault(name, {})
    for name in found:
        found[name] = read_state(name) or {}
    return found


# ------------------------------------------------------------------ down

def teardown(name: str) -> List[str]:
    """Remove cluster `name`: end every process inside its namespaces (ranks,
    delay daemons), delete the namespaces (which removes their links, qdiscs
    and rules) and the state. Idempotent; returns the namespaces deleted."""
    check_name(name)
    state = read_state(name) or {}
    pat = re.compile(re.escape(NS_PREFIX + name) + r"-(sw|h[0-9]+)")
    present = existing_namespaces()
    mine = [ns for ns in present if pat.fullmatch(ns)]
    mine += [ns for ns in state.get("namespaces", []) if ns in present and ns not in mine]
    pids = [p for ns in mine for p in namespace_pids(ns)]
    pids += [p for p in state.get("daemons", {}).values() if p not in pids]
    kill_pids(pids)
    for ns in mine:
        _sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(state_dir(name), ignore_errors=True)
    left = [ns for ns in mine if ns in existing_namespaces()]
    if left:
        raise ClusterError(f"could not delete namespaces {left}")
    return mine


# ------------------------------------------------------------------ up

def build(name: str, hosts: int, rate: str = "1gbit", delay: str = "0", mtu: int = 1500,
          subnet: str = DEFAULT_SUBNET, owner_pid: Optional[int] = None) -> Dict:
    """Build cluster `name` (removing an old one of that name first); on any
    failure remove what was built and raise ClusterError. Returns its state."""
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise ClusterError(f"hosts must be 1..{MAX_HOSTS}, got {hosts}")
    bps, delay_us = parse_rate(rate), parse_delay(delay)
    why = unavailable_reason(delay=delay_us > 0)
    if why:
        raise ClusterError(why)
    if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet):
        raise ClusterError(f"subnet {subnet!r}: give the first three octets, e.g. {DEFAULT_SUBNET}")
    # A GSO packet bigger than the token bucket is segmented in software by
    # tbf; a huge bucket lets a burst through at memory speed. ~100 us of line
    # rate (16..64 KiB) keeps both small; the bucket holds one such packet.
    gso = 65536 if bps == 0 else min(65536, max(16384, int(bps / 8 * 100e-6)))
    burst = gso + 2 * mtu
    teardown(name)
    state = {"name": name, "hosts": hosts, "rate": rate if bps else "none", "rate_bps": bps,
             "delay": delay if delay_us else "0", "delay_us": delay_us, "delay_mode": "none",
             "mtu": mtu, "gso": gso, "burst": burst, "subnet": subnet, "iface": IFACE,
             "owner_pid": owner_pid or os.getpid(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "namespaces": [], "daemons": {}, "complete": False}
    try:
        _build(state, bps, delay_us)
        _check_reachable(state)
        state["complete"] = True
        _write_state(state)
        return state
    except BaseException as e:  # also Ctrl-C half-way: leave nothing behind
        try:
            teardown(name)
        except ClusterError:
            pass
        if isinstance(e, (ClusterError, subprocess.TimeoutExpired)):
            raise ClusterError(f"building cluster {name!r} failed (removed again): {e}") from e
        raise


def _new_ns(state: Dict, ns: str) -> None:
    state["namespaces"].append(ns)
    _write_state(state)  # recorded before creation: teardown finds half-built ones
    _sh("ip", "netns", "add", ns)
    _sh("ip", "-n", ns, "link", "set", "lo", "up")
    # Per-namespace sysctls (only ours): TCP windows large enough for any
    # rate x RTT we emulate; keep cwnd across the idle gaps between
    # collectives as cluster hosts are usually tuned; no IPv6 chatter.
    _sh("ip", "netns", "exec", ns, "sysctl", "-qw",
        "net.ipv4.tcp_rmem=4096 131072 33554432", "net.ipv4.tcp_wmem=4096 65536 33554432",
        "net.ipv4.tcp_slow_start_after_idle=0", check=False)
    _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1", check=False)


def _tbf(ns: str, dev: str, state: Dict, parent: List[str]) -> None:
    _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, *parent, "handle", "10:", "tbf",
        "rate", str(state["rate_bps"]) + "bit", "burst", str(state["burst"]), "latency", "50ms")


def _build(state: Dict, bps: int, delay_us: float) -> None:
    name, sw, sub = state["name"], switch_ns(state["name"]), state["subnet"]
    mtu = str(state["mtu"])
    _new_ns(state, sw)
    _sh("ip", "-n", sw, "link", "add", BRIDGE, "mtu", mtu, "type", "bridge", "stp_state", "0",
        "forward_delay", "0")
    _sh("ip", "-n", sw, "addr", "add", f"{sub}.254/24", "dev", BRIDGE)
    _sh("ip", "-n", sw, "link", "set", BRIDGE, "up")
    netem = delay_us > 0 and _netem_available(sw)
    state["delay_mode"] = "netem" if netem else ("nfqueue" if delay_us > 0 else "none")
    for k in range(state["hosts"]):
        ns, port = host_ns(name, k), f"gfp{k}"
        _new_ns(state, ns)
        _sh("ip", "-n", sw, "link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", IFACE,
            "mtu", mtu, "netns", ns)
        for where, dev in ((sw, port), (ns, IFACE)):
            _sh("ip", "-n", where, "link", "set", dev, "gso_max_size", str(state["gso"]))
        _sh("ip", "-n", sw, "link", "set", port, "master", BRIDGE, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{sub}.{k + 1}/24", "dev", IFACE)
        _sh("ip", "-n", ns, "link", "set", IFACE, "up")
        if bps:
            _tbf(ns, IFACE, state, ["root"])                       # uplink
        if netem:
            _sh("tc", "-n", sw, "qdisc", "add", "dev", port, "root", "handle", "1:", "netem",
                "delay", f"{delay_us:g}us", "limit", "100000")
            if bps:
                _tbf(sw, port, state, ["parent", "1:1"])            # downlink
        elif bps:
            _tbf(sw, port, state, ["root"])                         # downlink
        if state["delay_mode"] == "nfqueue":
            _start_delayd(state, ns, delay_us)
    _write_state(state)


def _netem_available(sw: str) -> bool:
    """Probe on a dummy link inside our switch namespace (the kernel may lack sch_netem)."""
    _sh("ip", "-n", sw, "link", "add", "gfprobe", "type", "dummy", check=False)
    ok = _sh("tc", "-n", sw, "qdisc", "add", "dev", "gfprobe", "root", "netem", "delay", "1ms",
             check=False).returncode == 0
    _sh("ip", "-n", sw, "link", "del", "gfprobe", check=False)
    return ok


def _start_delayd(state: Dict, ns: str, delay_us: float) -> None:
    ipt = _iptables()
    _sh("ip", "netns", "exec", ns, ipt, "-w", "-t", "mangle", "-A", "PREROUTING", "-i", IFACE,
        "-j", "NFQUEUE", "--queue-num", "0")
    ready = os.path.join(state_dir(state["name"]), f"delayd-{ns}.ready")
    log = open(os.path.join(state_dir(state["name"]), f"delayd-{ns}.log"), "w")
    # Real-time priority: ranks busy-poll every core, and a normal-priority
    # daemon would release packets only at the next scheduler tick (ms jitter).
    rt = ["chrt", "-f", "20"] if shutil.which("chrt") else []
    cmd = ["ip", "netns", "exec", ns, *rt, sys.executable, DELAYD, "--delay-us", f"{delay_us:g}",
           "--queue", "0", "--ready-file", ready]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    log.close()
    state["daemons"][ns] = p.pid
    _write_state(state)
    deadline = time.monotonic() + 15
    while not os.path.exists(ready):
        if p.poll() is not None or time.monotonic() > deadline:
            with open(os.path.join(state_dir(state["name"]), f"delayd-{ns}.log")) as f:
                raise ClusterError(f"delay daemon did not start in {ns}: {f.read().strip()[-500:]}")
        time.sleep(0.05)


def _check_reachable(state: Dict) -> None:
    """Host 0 reaches every other host: a TCP connect to a closed port is
    answered with a reset (ECONNREFUSED) when the link works, so no listener
    and no ping are needed."""
    if state["hosts"] < 2:
        return
    code = ("import socket,sys\n"
            "for ip in sys.argv[1:]:\n"
            "    s=socket.socket(); s.settimeout(5)\n"
            "    try: s.connect((ip, 9))\n"
            "    except ConnectionRefusedError: pass\n"
            "    except OSError as e: sys.exit(f'{ip}: {e}')\n"
            "    finally: s.close()\n")
    ips = [f"{state['subnet']}.{k + 1}" for k in range(1, state["hosts"])]
    _sh("ip", "netns", "exec", host_ns(state["name"], 0), sys.executable, "-c", code, *ips,
        timeout=60)
