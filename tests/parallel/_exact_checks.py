"""Exact-result checks shared by the SPMD scripts that test integer
reductions (small_ints_script.py, int_scaling_script.py): a result must have
the expected dtype and values and be bitwise identical on every rank. The
numpy SPMD scripts take `same_everywhere` from here for the last part."""
import hashlib

import numpy as np

import gradflow as gf


def same_everywhere(a, what, process_set=None):
    """Every rank (of `process_set`, default all) holds the same bytes: the
    SHA-256 digests of `a` allgathered and compared."""
    digest = np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest(), np.uint8)
    everyone = gf.allgather(digest.reshape(1, -1), name=f"digest.{what}", process_set=process_set)
    assert (everyone == everyone[0]).all(), f"rank {gf.rank()}: {what}: ranks differ bitwise"


def check(got, want, what):
    """got equals want exactly (dtype and values) and is the same on every rank."""
    got = np.asarray(got)
    r = gf.rank()
    assert got.dtype == want.dtype, f"rank {r}: {what}: dtype {got.dtype}, want {want.dtype}"
    assert np.array_equal(got, want), f"rank {r}: {what}: got {got}, want {want}"
    same_everywhere(got, what)
