"""Soak (short CI version): mixed collectives of random sizes on 4 ranks,
checked against numpy, RSS growth after warm-up bounded, no hang.
Long version: python benchmarks/soak.py (20,000 ops; see docs/robustness.md),
or GRADFLOW_SOAK_OPS=10000 pytest tests/parallel/test_soak.py."""
import os
import time

from _launch import run_mpi


def test_soak_mixed_collectives_4_ranks():
    ops = os.environ.get("GRADFLOW_SOAK_OPS", "1000")
    t0 = time.monotonic()
    out = run_mpi(4, "soak_script.py", "--ops", ops, "--seed", "3", "--rss-bound-mb", "32",
                  timeout=120 + int(ops) // 5)
    assert f"soak OK on 4 ranks: {ops} ops" in out.stdout, out.stdout[-3000:]
    if "GRADFLOW_SOAK_OPS" not in os.environ:
        assert time.monotonic() - t0 < 90
