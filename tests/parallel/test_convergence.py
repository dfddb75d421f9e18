"""Compression must not hurt accuracy: on scikit-learn's digits (real data),
2 ranks, same seed, epochs and learning rate, every communication mode ends
within 1 percentage point of dense fp32 test accuracy (CSC also under
autocast + GradScaler, and with FusedLinear layers)."""
import json

import pytest

from _launch import run_mpi

pytest.importorskip("torch")
pytest.importorskip("sklearn")

# 40 epochs: CSC at 1% has a loss transient after the dense warm-up (see
# benchmarks/results/convergence.json) that takes ~20 epochs to settle; at 30
# epochs csc0.01+amp ended 1.1 points under dense in one numeric environment
# (2026-11-24: 0.9644 vs 0.9756) and within 0.3 at 40 (0.9689 vs 0.9711), so
# the comparison is made on settled models, at the same 1-point tolerance.
EPOCHS = "40"
# CSC settings: chunks small enough that a 50k-parameter MLP has ~800 of
# them (with the default 32768 the whole model would be 2 chunks), and 50
# dense warm-up steps (about 2 epochs).
CSC_ENV = {"GRADFLOW_SPARSE_CHUNK": "64", "GRADFLOW_SPARSE_WARMUP_STEPS": "50"}


def train(mode):
    out = run_mpi(2, "convergence_script.py", mode, EPOCHS, env=CSC_ENV, timeout=300)
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][0]
    return json.loads(line[len("RESULT "):])


def test_compressed_modes_match_dense_accuracy():
    dense = train("dense")
    assert dense["accuracy"] >= 0.95, dense
    # csc0.01+amp: autocast(float16) + GradScaler (grad_scaler= keeps the
    # residual unscaled; overflow steps are skipped without losing the
    # residual), initial scale 2**24 so it overflows at first.
    # csc0.01+fl: FusedLinear layers, the residual in the pool (gf-all's path)
    results = {m: train(m) for m in ["fp16", "bf16", "csc0.1", "csc0.01", "csc0.01+amp",
                                     "csc0.01+fl"]}
    report = {m: round(r["accuracy"], 4) for m, r in results.items()}
    report["dense"] = round(dense["accuracy"], 4)
    for mode, r in results.items():
        assert r["accuracy"] >= dense["accuracy"] - 0.01, report
    amp = results["csc0.01+amp"]
    assert 0 < amp["skipped_steps"] < 40 and amp["loss_scale"] >= 2.0 ** 10, amp
    # CSC really sent less: chunk counters and bytes on the wire.
    assert results["csc0.01"]["chunks_sent"] < 0.05 * results["csc0.01"]["chunks_total"]
    assert results["csc0.01"]["bytes_sent"] < 0.5 * dense["bytes_sent"]
    assert results["fp16"]["bytes_sent"] < 0.6 * dense["bytes_sent"]
