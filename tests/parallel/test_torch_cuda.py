"""gradflow.torch with CUDA tensors (torch_cuda_script.py): the collectives,
DistributedOptimizer's paths, AMP and SyncBatchNorm on a GPU, against closed
forms and plain torch on the same device. Skipped without a CUDA device (this
project's CI has none; docs/gpu.md says where and when it ran on one). The
CPU variant runs the same script with CPU tensors everywhere, so the script
itself is kept working where CI runs."""
import importlib.util
import re

import pytest

from _launch import run_mpi

SECTIONS = 14


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


def _oks(out, n):
    # Found anywhere in a line, not only at its start: mpiexec forwards the
    # ranks' output in chunks, and another rank's "done" line was once glued
    # in front of an "ok" line (CI, 2026-11-27).
    return re.findall(rf"ok [^\n]*?\(size {n}\)", out.stdout)


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device (docs/gpu.md: run on a GPU machine)")
@pytest.mark.parametrize("n", [2, 3])
def test_torch_cuda_tensors(n):
    out = run_mpi(n, "torch_cuda_script.py", timeout=300)
    assert len(_oks(out, n)) == SECTIONS, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_cuda_script_on_cpu_tensors():
    """The same checks with GRADFLOW_TEST_DEVICE=cpu (AMP with bfloat16
    autocast and a CPU GradScaler there)."""
    out = run_mpi(2, "torch_cuda_script.py", timeout=240, env={"GRADFLOW_TEST_DEVICE": "cpu"})
    assert len(_oks(out, 2)) == SECTIONS, out.stdout
