"""gradflowrun across 2 "hosts" on this machine: the project's emulated
cluster (benchmarks/cluster: one network namespace per host joined by a
bridge), 2 ranks per host, MPICH over TCP (libfabric tcp on the hosts' NIC,
selected with --network-interface). Checks placement (-H), local/cross
ranks and that data crosses the link.

Skipped, with the reason, when the cluster cannot be built here (not root,
no iproute2/unshare, a container without CAP_SYS_ADMIN). Uses a cluster of
its own (named after this process), so it never touches another user's,
and always removes it.
"""
import os
import subprocess
import sys
import time

import pytest

from _launch import HERE, ROOT, in_place_build, run_cwd


def _cluster_module():
    # benchmarks/ is not an installed package: import it from the source tree
    # without leaving the tree on sys.path (the installed gradflow is tested).
    sys.path.insert(0, ROOT)
    try:
        import benchmarks.cluster as cluster
    finally:
        sys.path.remove(ROOT)
    return cluster


cl = _cluster_module()


@pytest.fixture(scope="module")
def two_hosts():
    why = cl.unavailable_reason()
    if why:
        pytest.skip(why)
    c = cl.Cluster(2, rate="none", delay="0", name=f"mh{os.getpid()}")
    try:
        c.up()
    except cl.ClusterError as e:
        pytest.skip(f"cannot build the emulated cluster here: {e}")
    try:
        yield c
    finally:
        c.down()


def _run_across_hosts(c, script, *flags, env=None):
    """gradflowrun -np 4 on the 2 hosts of cluster c (2 ranks each) running `script`."""
    full = c.env(2, ranks=4)  # MPICH on ofi/tcp, no shared memory, big inject size
    full.update({"MPIR_CVAR_POLLS_BEFORE_YIELD": "10", "GRADFLOW_TIMEOUT": "30",
                 "GRADFLOW_TEST_IFACE": cl.IFACE})
    full.update(env or {})
    if in_place_build():
        full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    # gradflowrun runs on host 0 (like a cluster's first node); hydra reaches
    # the hosts through the harness's rsh-style launcher.
    h0, h1 = c.host_ip(0), c.host_ip(1)
    cmd = c.host_command(0, [sys.executable, "-m", "gradflow.runner.launch",
                             "-np", "4", "-H", f"{h0}:2,{h1}:2", "--network-interface", cl.IFACE,
                             "--verbose", *flags, "--mpi-args",
                             f"-launcher rsh -launcher-exec {cl.RSH} -localhost {h0}",
                             sys.executable, os.path.join(HERE, script)])
    t0 = time.monotonic()
    try:
        r = c.run_command(cmd, cwd=run_cwd(), env=full, timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after 180 s: {e}")
    report = f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    assert r.returncode == 0, report
    assert time.monotonic() - t0 < 120, report
    return r, report


@pytest.mark.parametrize("algo", ["ring", "two-sync"])  # two-sync: MPI_Get across hosts
def test_gradflowrun_across_two_hosts(two_hosts, algo):
    r, report = _run_across_hosts(two_hosts, "multihost_script.py", "--allreduce-algo", algo)
    assert f"-iface {cl.IFACE}" in r.stderr and f"-genv FI_TCP_IFACE {cl.IFACE}" in r.stderr, report
    assert f"[0]<stdout>: multihost OK: 4 ranks with {algo}" in r.stdout, report
    for rank in range(4):
        assert f"[{rank}]<stdout>: multihost rank {rank}: host " in r.stdout, report
        assert f"local {rank % 2}/2 cross {rank // 2}/2" in r.stdout, report


def test_two_sync_wire_rounding_across_hosts(two_hosts):
    # The RMA path without shared memory: MPI_Get of 16-bit shards, same model.
    r, report = _run_across_hosts(two_hosts, "wire_rounding_script.py",
                                  "--allreduce-algo", "two-sync")
    assert "[0]<stdout>: wire rounding OK on 4 ranks with two-sync" in r.stdout, report


@pytest.mark.parametrize("script,ok", [("halving_doubling_script.py", "halving-doubling OK on 4 ranks"),
                                       ("wire_rounding_script.py",
                                        "wire rounding OK on 4 ranks with halving-doubling")])
def test_halving_doubling_across_hosts(two_hosts, script, ok):
    # Only across nodes the first allgather receive is posted early, into a
    # staging area (Note [Early allgather receive]); 64 KiB pieces.
    r, report = _run_across_hosts(two_hosts, script, "--allreduce-algo", "halving-doubling",
                                  env={"GRADFLOW_RING_PIPELINE_BYTES": str(64 << 10)})
    assert f"[0]<stdout>: {ok}" in r.stdout, report


def test_auto_takes_the_ring_across_hosts(two_hosts):
    r, report = _run_across_hosts(two_hosts, "algo_choice_script.py", "--allreduce-algo", "auto",
                                  env={"EXPECT_ONE_NODE": "0"})
    assert "[0]<stdout>: algo choice OK on 4 ranks with auto" in r.stdout, report


def test_two_rank_ring_with_many_pieces_in_flight(two_hosts):
    # Note [Receives before send waits] (native/ring_allreduce.cc): one rank
    # per host, so left == right and the allgather pieces cross the
    # reduce-scatter on one TCP connection; 256 KiB pieces, 16 MiB buffers,
    # out of place, in place and on the 16-bit wire, bitwise against numpy.
    env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="10", GRADFLOW_TIMEOUT="60",
               GRADFLOW_RING_PIPELINE_BYTES=str(256 << 10), GRADFLOW_ALLREDUCE_ALGO="ring")
    if in_place_build():
        env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        r = two_hosts.run([sys.executable, os.path.join(HERE, "two_rank_ring_script.py")], n=2,
                          timeout=240, env=env, cwd=run_cwd())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after 240 s: {e}")
    report = f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    assert r.returncode == 0, report
    assert "two-rank ring OK" in r.stdout, report
