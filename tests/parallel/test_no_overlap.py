"""DistributedOptimizer(overlap=False) under mpiexec on 1-4 ranks: nothing is
submitted before step(), the parameters equal the default overlap path's bit
for bit (and single-process training), and bad values raise everywhere.
GRADFLOW_FUSION_THRESHOLD=0: on the copy path the fusion buffer groups
whatever is queued in a cycle, which depends on timing, and a fused ring
adds an element's terms in an order set by its offset in the fused buffer;
without fusion each gradient is its own ring, so both paths are bitwise
comparable. GRADFLOW_POOL_MERGE=0 for the same reason on the pool path:
adjacent buckets ready in one cycle go out as one ring (the default), and
which buckets share a cycle depends on timing (overlap=False submits them
all at once), so at 3+ ranks the terms' order would differ."""
import importlib.util

import pytest

from _launch import run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_overlap_equals_overlap_bitwise(n):
    out = run_mpi(n, "torch_no_overlap_script.py", env={"GRADFLOW_FUSION_THRESHOLD": "0", "GRADFLOW_POOL_MERGE": "0"},
                  timeout=240)
    oks = [ln for ln in out.stdout.splitlines() if ln.startswith("ok ") and f"(size {n})" in ln]
    assert len(oks) == 8, out.stdout
