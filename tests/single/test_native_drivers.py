"""Builds and runs the C++ test drivers of native/tests/ (no Python binding in
between): codec kernels SIMD vs scalar, CSC selection/residual and fusion
planning with g++, and the transport layer (MpiComm, ring, two-sync,
collectives) with the MPI compiler wrapper under mpiexec on 1-4 ranks."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE = os.path.join(ROOT, "native")


def _tool(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    path = beside if os.path.exists(beside) else shutil.which(name)
    assert path, f"{name} not found (the mpich wheel provides it next to python)"
    return path


def _build(tmp_path, compiler: str, sources, name: str, defines=()) -> str:
    out = str(tmp_path / name)
    cmd = [compiler, "-O1", "-std=c++17", f"-I{NATIVE}", *defines,
           *[os.path.join(NATIVE, s) for s in sources], "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return out


def _run(cmd, timeout=120) -> str:
    env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="10")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def test_codec_kernels(tmp_path):
    exe = _build(tmp_path, shutil.which("g++") or "c++",
                 ["common.cc", "wire_codec.cc", "reduce_kernels.cc", "tests/codec_kernels_test.cc"],
                 "codec_test")
    _run([exe])


def test_sparse_and_fusion(tmp_path):
    exe = _build(tmp_path, shutil.which("g++") or "c++",
                 ["common.cc", "sparse_chunks.cc", "fusion_buffer.cc", "tests/sparse_fusion_test.cc"],
                 "sparse_fusion_test")
    assert "all" in _run([exe])


def test_pool_merge_planning(tmp_path):
    exe = _build(tmp_path, shutil.which("g++") or "c++",
                 ["pool_merge.cc", "tests/pool_merge_test.cc"], "pool_merge_test")
    assert "all checks passed" in _run([exe])


@pytest.fixture(scope="module")
def transport_exe(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("transport"), _tool("mpicxx"),
                  ["common.cc", "mpi_comm.cc", "mpi_control_collectives.cc",
                   "mpi_data_collectives.cc", "rma_window.cc", "ring_allreduce.cc",
                   "two_sync_allreduce.cc", "mpi_allreduce.cc", "collectives.cc", "wire_codec.cc",
                   "reduce_kernels.cc", "tests/transport_test.cc"],
                  "transport_test")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_transport(transport_exe, n):
    out = _run([_tool("mpiexec"), "-n", str(n), transport_exe], timeout=180)
    assert "ALL PASSED" in out


@pytest.fixture(scope="module")
def alltoall_protocol_exe(tmp_path_factory):
    # A 64-byte MPI count limit puts rank 0's alltoall totals past it and the
    # other ranks' not: the protocol must still be the same on every rank.
    return _build(tmp_path_factory.mktemp("a2a"), _tool("mpicxx"),
                  ["common.cc", "mpi_comm.cc", "mpi_control_collectives.cc",
                   "mpi_data_collectives.cc", "rma_window.cc", "ring_allreduce.cc",
                   "collectives.cc", "wire_codec.cc", "reduce_kernels.cc",
                   "tests/alltoall_protocol_test.cc"],
                  "alltoall_protocol_test", defines=("-DGRADFLOW_MAX_MPI_COUNT=64",))


@pytest.mark.parametrize("n", [2, 3])
def test_alltoall_protocol_agreed_past_max_count(alltoall_protocol_exe, n):
    out = _run([_tool("mpiexec"), "-n", str(n), alltoall_protocol_exe], timeout=120)
    assert f"ALL PASSED on {n} ranks" in out
