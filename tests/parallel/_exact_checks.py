"""Exact-result checks shared by the SPMD scripts that test integer
reductions (small_ints_script.py, int_scaling_script.py): a result must have
the expected dtype and values and be bitwise identical on every rank."""
import numpy as np

import gradflow as gf


def same_everywhere(a, what):
    """Every rank holds the same bytes as rank 0 (an allgather of the raw bytes)."""
    everyone = gf.allgather(np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8)[None, :],
                            name=f"bytes.{what}")
    assert all((row == everyone[0]).all() for row in everyone), f"{what}: ranks differ"


def check(got, want, what):
    """got equals want exactly (dtype and values) and is the same on every rank."""
    got = np.asarray(got)
    r = gf.rank()
    assert got.dtype == want.dtype, f"rank {r}: {what}: dtype {got.dtype}, want {want.dtype}"
    assert np.array_equal(got, want), f"rank {r}: {what}: got {got}, want {want}"
    same_everywhere(got, what)
