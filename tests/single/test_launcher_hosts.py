"""gradflowrun's view of this machine without MPI: which host names are
local (is_local_host) and the folding of this machine's aliases into one
host (merge_local_aliases), so that ``-H localhost:2,127.0.0.1:1`` runs three
ranks with local_rank 0, 1, 2 instead of two ranks with local_rank 0.
tests/parallel/test_launcher_run.py runs that job for real.
"""

import shutil
import socket
import subprocess

import pytest

from gradflow.runner import hosts as H
from gradflow.runner import launch as L



def parse(argv):
    return L.build_parser([]).parse_args(argv)


def _interface_addresses():
    """This machine's non-loopback IPv4 addresses, from `ip` (empty if none
    or no `ip`)."""
    if not shutil.which("ip"):
        return []
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    fields = [line.split() for line in out.splitlines()]
    addrs = [f[f.index("inet") + 1].split("/")[0] for f in fields if "inet" in f]
    return [a for a in addrs if not a.startswith("127.")]


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "127.0.1.1", socket.gethostname()])
def test_loopback_names_are_local(name):
    assert H.is_local_host(name)


def test_interface_addresses_are_local():
    # The old check compared with gethostbyname(gethostname()) only, which
    # is often 127.0.x.1: the machine's own LAN address was "remote".
    addrs = _interface_addresses()
    if not addrs:
        pytest.skip("no non-loopback IPv4 address here")
    assert all(H.is_local_host(a) for a in addrs), addrs


def test_other_names_are_not_local():
    # TEST-NET-3 is never routed; skip in the unlikely case it is assigned here.
    if "203.0.113.77" in _interface_addresses():
        pytest.skip("203.0.113.77 is this machine's")
    assert not H.is_local_host("203.0.113.77")
    assert not H.is_local_host("no-such-host.invalid")


def test_local_aliases_merge_at_the_first_ones_place():
    hosts = [H.HostSlots("a", 1), H.HostSlots("localhost", 2), H.HostSlots("b", 2),
             H.HostSlots("127.0.0.1", 1), H.HostSlots("me", 3)]
    local = {"localhost", "127.0.0.1", "me"}
    merged = H.merge_local_aliases(hosts, is_local=lambda n: n in local)
    assert merged == [H.HostSlots("a", 1), H.HostSlots("localhost", 6), H.HostSlots("b", 2)]
    # No aliases: unchanged, order kept.
    assert H.merge_local_aliases(hosts[:3], is_local=lambda n: n in local) == hosts[:3]
    assert H.merge_local_aliases([H.HostSlots("a", 1)], is_local=lambda n: False) == \
        [H.HostSlots("a", 1)]


def test_launch_places_aliased_local_ranks_on_one_host(tmp_path):
    # Hydra starts one proxy per name, and MPICH's local_rank follows the
    # proxies: before, this was '-hosts localhost:2,127.0.0.1:1' and rank 2
    # had local_rank 0 beside rank 0.
    args = parse(["-np", "3", "-H", "localhost:2,127.0.0.1:1", "python", "x.py"])
    argv, _ = L.build_launch(args, [], base_env={})
    assert argv[argv.index("-hosts") + 1] == "localhost:3"
    assert L.validate(args) == ["localhost"] * 3
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost:1\n")
    args = parse(["-np", "2", "--hostfile", str(hostfile), "python", "x.py"])
    argv, _ = L.build_launch(args, [], base_env={})
    assert argv[argv.index("-hosts") + 1] == "127.0.0.1:2"
