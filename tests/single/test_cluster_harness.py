"""The emulated-cluster harness (benchmarks/cluster) itself: argument
parsing and refusals everywhere; as root, that up/down are idempotent, that a
failed build leaves nothing behind, and that a host's NIC is shaped as asked.
The multi-host MPI runs on it are tests/parallel/test_multihost.py."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cluster_module():
    # benchmarks/ is not installed: import from the source tree without
    # leaving it on sys.path (the installed gradflow stays the one tested)
    sys.path.insert(0, ROOT)
    try:
        import benchmarks.cluster as cluster
    finally:
        sys.path.remove(ROOT)
    return cluster


cl = _cluster_module()
topo = sys.modules["benchmarks.cluster._topology"]


def test_rates_and_delays_parse_like_tc():
    assert topo.parse_rate("1gbit") == 10**9
    assert topo.parse_rate("500mbit") == 5 * 10**8
    assert topo.parse_rate("100mbps") == 8 * 10**8
    assert topo.parse_rate("none") == 0
    assert topo.parse_delay("0") == 0
    assert topo.parse_delay("500us") == 500
    assert topo.parse_delay("1.5ms") == 1500
    for bad in ("fast", "1gb", "-1gbit"):
        with pytest.raises(cl.ClusterError, match="tc syntax"):
            topo.parse_rate(bad)
    for bad in ("5", "1min", "soon"):
        with pytest.raises(cl.ClusterError, match="delay"):
            topo.parse_delay(bad)


def test_names_are_checked_before_anything_is_built():
    for bad in ("", "Upper", "has-dash", "x" * 21, "../etc"):
        with pytest.raises(cl.ClusterError, match="cluster name"):
            cl.Cluster(2, name=bad)


def test_not_root_is_a_clear_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = cl.unavailable_reason()
    assert why and "root" in why
    with pytest.raises(cl.ClusterError, match="root"):
        topo.build("nonroot", 2)


def test_missing_tools_are_named(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(topo.shutil, "which", lambda tool: None if tool == "tc" else "/bin/" + tool)
    assert "`tc` not found (apt-get install -y iproute2)" in cl.unavailable_reason()


@pytest.fixture
def root_only():
    why = cl.unavailable_reason()
    if why:
        pytest.skip(why)
    name = f"ut{os.getpid()}"
    yield name
    cl.teardown(name)


def _namespaces(name):
    return sorted(ns for ns in topo.existing_namespaces() if ns.startswith(f"gradflow-{name}-"))


def test_up_down_idempotent_and_shaped(root_only):
    name = root_only
    c = cl.Cluster(2, rate="200mbit", name=name)
    c.up()
    c.up()  # rebuilds the same cluster, no error, no duplicates
    assert _namespaces(name) == [f"gradflow-{name}-{x}" for x in ("h0", "h1", "sw")]
    qdisc = subprocess.run(["tc", "-n", c.host_ns(1), "qdisc", "show", "dev", cl.IFACE],
                           capture_output=True, text=True, timeout=30).stdout
    assert "tbf" in qdisc and "200Mbit" in qdisc, qdisc
    # the host command runs in the host's network and under its own hostname
    probe = ["sh", "-c", f"hostname; cat /sys/class/net/{cl.IFACE}/address"]
    r = subprocess.run(c.host_command(1, probe), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.split()[0] == c.host_ns(1), r
    assert cl.Cluster.attach(name).hosts == 2
    c.down()
    c.down()
    assert _namespaces(name) == [] and cl.teardown(name) == []
    with pytest.raises(cl.ClusterError, match="no emulated cluster"):
        cl.Cluster.attach(name)


def test_failed_build_leaves_nothing(root_only):
    name = root_only
    with pytest.raises(cl.ClusterError, match="removed again"):
        topo.build(name, 2, mtu=10)  # the bridge refuses this MTU after the first namespace exists
    assert _namespaces(name) == []
    assert not os.path.exists(topo.state_dir(name))
