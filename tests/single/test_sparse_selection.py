"""Coarse-grained sparse chunk selection: importance and the global top-k."""
import numpy as np

from gradflow import _native


def test_importance_is_l1_per_chunk_with_short_tail():
    x = np.array([1, -2, 3, -4, 5, -6, 7], np.float32)
    np.testing.assert_allclose(_native.chunk_importance(x, 3), [6, 15, 7])


def test_top_k_sorted_and_ties_by_index():
    imp = [1.0, 5.0, 5.0, 0.0, 5.0, 2.0]
    assert _native.select_top_chunks(imp, 2) == [1, 2]
    assert _native.select_top_chunks(imp, 4) == [1, 2, 4, 5]
    assert _native.select_top_chunks(imp, 0) == []
    assert _native.select_top_chunks(imp, 99) == list(range(6))


def test_top_k_matches_reference_on_random_vectors():
    rng = np.random.default_rng(0)
    for _ in range(20):
        imp = rng.integers(0, 5, 300).astype(np.float32).tolist()  # many ties
        k = int(rng.integers(1, 300))
        ref = sorted(sorted(range(300), key=lambda i: (-imp[i], i))[:k])
        assert _native.select_top_chunks(imp, k) == ref
