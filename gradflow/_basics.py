# _basics.py — Horovod's "basics" that are not rank/size: what the build
# supports (mpi_built, nccl_built, ...), what the job runs with (mpi_enabled,
# is_homogeneous), the run-time timeline switch, and Horovod's exception
# names. Every framework module (gradflow.torch, .tensorflow, .keras)
# re-exports these, as each horovod.* module does.
"""Horovod's build and runtime queries, timeline switch and exception types."""
from __future__ import annotations

from . import _native

# Every GradflowError is a HorovodInternalError (a RuntimeError), so Horovod
# code that catches the latter around collectives catches gradflow's errors.
HorovodInternalError = _native.HorovodInternalError
# Bad arguments and "not initialized": both a GradflowError and a ValueError,
# the type Horovod raises for them.
GradflowValueError = _native.GradflowValueError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "is_homogeneous",
           "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
           "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built",
           "start_timeline", "stop_timeline"]


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-mode interrupt: hosts were added or removed. Raised
    on every rank together by an elastic job's State.commit() /
    check_host_updates(); the elastic run loop catches it and re-forms the
    group (skip_sync: only hosts were removed, the states are still equal)."""

    def __init__(self, skip_sync: bool):
        super().__init__(skip_sync)
        self.skip_sync = skip_sync


def _require_init(what: str) -> None:
    if not _native.is_initialized():
        raise GradflowValueError(f"gradflow.{what}: gradflow has not been initialized: call "
                                 "gradflow.init() (or hvd.init()) first")


def is_homogeneous() -> bool:
    """True if every node runs the same number of ranks (checked once, at init)."""
    return bool(_native.is_homogeneous())


def mpi_threads_supported() -> bool:
    """True: gradflow requires MPI_THREAD_MULTIPLE (init fails without it),
    so mixing in mpi4py is safe. ValueError before init(), as in Horovod."""
    _require_init("mpi_threads_supported")
    return True


def mpi_enabled() -> bool:
    """True: MPI is gradflow's only controller and transport."""
    return True


def mpi_built() -> bool:
    """True: gradflow is always built against MPI."""
    return True


def gloo_enabled() -> bool:
    """False: gradflow has no Gloo controller."""
    return False


def gloo_built() -> bool:
    """False: gradflow has no Gloo support."""
    return False


def nccl_built() -> int:
    """0 (Horovod returns NCCL's version code, or 0 without NCCL): gradflow is CPU-only."""
    return 0


def ddl_built() -> bool:
    """False: no IBM DDL support."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL support."""
    return False


def cuda_built() -> bool:
    """False: the core has no CUDA code (CUDA tensors are staged through host memory)."""
    return False


def rocm_built() -> bool:
    """False: no ROCm support."""
    return False


def sycl_built() -> bool:
    """False: no SYCL (Intel GPU) support. Horovod added it after 0.28.1;
    its current examples call it by default."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing the Chrome-trace timeline to `file_path` (as
    GRADFLOW_TIMELINE does from the start). Call it on every rank, as in
    Horovod; rank 0 writes the file. A timeline already being written is
    closed first. `mark_cycles` adds an instant event per background cycle
    that carried work. ValueError before init(). Unlike Horovod, no
    HOROVOD_TIMELINE=DYNAMIC setting is needed."""
    if not isinstance(file_path, str):
        raise TypeError(f"gradflow.start_timeline: file_path must be a str, got "
                        f"{type(file_path).__name__}")
    _native.timeline_start(file_path, bool(mark_cycles))


def stop_timeline() -> None:
    """Finish and close the timeline file (a no-op when none is being
    written). Call it on every rank. ValueError before init()."""
    _native.timeline_stop()
