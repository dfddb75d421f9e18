"""gradflowrun across 2 "hosts" on this machine: network namespaces from
../shared/tools/netns joined by a bridge, 2 ranks per host, MPICH over TCP
(libfabric tcp on the hosts' hxeth0, selected with --network-interface).
Checks placement (-H), local/cross ranks and that data crosses the link.

Skipped, with the reason, when namespaces cannot be created (not root, no
iproute2, a container without CAP_SYS_ADMIN, or the tools are missing). Uses
its own namespace prefix (gfmh-*) so it never touches another user's set,
and always removes what it created.
"""
import os
import shutil
import subprocess
import sys
import time

import pytest

from _launch import HERE, ROOT, in_place_build, run_cwd

# The tools live beside the project (../shared); a clean clone elsewhere (CI)
# finds them at the development machine's fixed location.
_CANDIDATES = [os.path.normpath(os.path.join(ROOT, "..", "shared", "tools", "netns")),
               "/work/shared/tools/netns"]
TOOLS = os.environ.get("GRADFLOW_NETNS_TOOLS") or next(
    (d for d in _CANDIDATES if os.path.isfile(os.path.join(d, "netns-up.sh"))), _CANDIDATES[0])
NS_ENV = {"HX_PREFIX": "gfmh", "HX_SUBNET": "10.97.3", "HX_STATE_DIR": "/run/gfmh"}
HOST_IP = [f"{NS_ENV['HX_SUBNET']}.{k + 1}" for k in range(2)]


def _why_not():
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if not os.path.isfile(os.path.join(TOOLS, "netns-up.sh")):
        return f"netns tools not found at {TOOLS} (set GRADFLOW_NETNS_TOOLS)"
    for tool in ("ip", "tc", "unshare"):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install -y iproute2 util-linux)"
    return None


def _tools_env():
    return dict(os.environ, **NS_ENV)


@pytest.fixture(scope="module")
def two_hosts():
    why = _why_not()
    if why:
        pytest.skip(why)
    up = subprocess.run([os.path.join(TOOLS, "netns-up.sh"), "2", "none", "0"], env=_tools_env(),
                        capture_output=True, text=True, timeout=120)
    try:
        if up.returncode != 0:
            pytest.skip("cannot create network namespaces here: "
                        + (up.stderr.strip().splitlines() or ["netns-up.sh failed"])[-1])
        yield
    finally:
        subprocess.run([os.path.join(TOOLS, "netns-down.sh")], env=_tools_env(),
                       capture_output=True, text=True, timeout=120)


def _run_across_hosts(script, *flags, env=None):
    """gradflowrun -np 4 on the 2 hosts (2 ranks each) running `script`."""
    full = _tools_env()
    full.update({"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_MAX_INJECT": "65536",
                 "MPIR_CVAR_POLLS_BEFORE_YIELD": "10", "OMP_NUM_THREADS": "1",
                 "GRADFLOW_TIMEOUT": "30"})
    full.update(env or {})
    if in_place_build():
        full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    # gradflowrun runs on host 0 (like a cluster's first node); hydra reaches
    # the hosts through the harness's rsh-style launcher.
    cmd = ["ip", "netns", "exec", "gfmh-h0", sys.executable, "-m", "gradflow.runner.launch",
           "-np", "4", "-H", f"{HOST_IP[0]}:2,{HOST_IP[1]}:2", "--network-interface", "hxeth0",
           "--verbose", *flags, "--mpi-args",
           f"-launcher rsh -launcher-exec {os.path.join(TOOLS, 'hx-launch.sh')} "
           f"-localhost {HOST_IP[0]}",
           sys.executable, os.path.join(HERE, script)]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=run_cwd(), env=full, capture_output=True, text=True, timeout=180)
    report = f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    assert r.returncode == 0, report
    assert time.monotonic() - t0 < 120, report
    return r, report


@pytest.mark.parametrize("algo", ["ring", "two-sync"])  # two-sync: MPI_Get across hosts
def test_gradflowrun_across_two_hosts(two_hosts, algo):
    r, report = _run_across_hosts("multihost_script.py", "--allreduce-algo", algo)
    assert "-iface hxeth0" in r.stderr and "-genv FI_TCP_IFACE hxeth0" in r.stderr, report
    assert f"[0]<stdout>: multihost OK: 4 ranks with {algo}" in r.stdout, report
    for rank in range(4):
        assert f"[{rank}]<stdout>: multihost rank {rank}: host " in r.stdout, report
        assert f"local {rank % 2}/2 cross {rank // 2}/2" in r.stdout, report


def test_two_sync_wire_rounding_across_hosts(two_hosts):
    # The RMA path without shared memory: MPI_Get of 16-bit shards, same model.
    r, report = _run_across_hosts("wire_rounding_script.py", "--allreduce-algo", "two-sync")
    assert "[0]<stdout>: wire rounding OK on 4 ranks with two-sync" in r.stdout, report


def test_auto_takes_the_ring_across_hosts(two_hosts):
    r, report = _run_across_hosts("algo_choice_script.py", "--allreduce-algo", "auto",
                                  env={"EXPECT_ONE_NODE": "0"})
    assert "[0]<stdout>: algo choice OK on 4 ranks with auto" in r.stdout, report
