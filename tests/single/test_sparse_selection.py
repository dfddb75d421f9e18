"""Coarse-grained sparse chunk selection: importance and the global top-k."""
import numpy as np
import pytest

from gradflow import _native
from _csc_sample import sample_blocks  # tests/parallel is on sys.path (conftest.py)


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


def _sampled_model(x, chunk, phase=0):
    """The sample rule of native/sparse_pool_residual.h in numpy
    (tests/parallel/_csc_sample.py): the sampled L1 norm of each chunk scaled
    by chunk length / sample length."""
    out = []
    for c, lo in enumerate(range(0, len(x), chunk)):
        part = np.abs(x[lo:lo + chunk].astype(np.float64))
        parts = sample_blocks(c, len(part), chunk, phase)
        total = sum(part[a:b].sum() for a, b in parts)
        out.append(total * len(part) / sum(b - a for a, b in parts))
    return np.array(out, np.float32)


@pytest.mark.parametrize("count,chunk", [(1000, 64), (100, 7), (70000, 32768), (5, 64), (33, 16)])
@pytest.mark.parametrize("phase", [0, 1, 5, 8, 13])
def test_sampled_importance_follows_the_rule(count, chunk, phase):
    x = np.random.default_rng(count).standard_normal(count).astype(np.float32)
    got = np.array(_native.sampled_chunk_importance(x, chunk, phase))
    np.testing.assert_allclose(got, _sampled_model(x, chunk, phase), rtol=1e-5)


@pytest.mark.parametrize("count,chunk", [(64, 64), (1000, 64), (70000, 32768), (33, 16)])
def test_sample_rotation_sees_every_element_within_8_steps(count, chunk):
    # A lone non-zero anywhere is seen at some phase of every 8: with a fixed
    # sample its chunk could wait for ever while the residual there grows.
    for i in sorted(set(range(0, count, max(1, count // 500))) | {count - 1}):
        x = np.zeros(count, np.float32)
        x[i] = 1.0
        seen = [_native.sampled_chunk_importance(x, chunk, ph)[i // chunk] > 0
                for ph in range(8)]
        assert any(seen), f"element {i} never sampled in 8 steps"


def test_sampled_importance_reads_an_eighth():
    # A spike outside the sample is invisible; one inside is seen, scaled.
    x = np.zeros(64, np.float32)
    x[1] = 1.0  # chunk 0, b = 4: group 0 samples block (0 + 0) % 8 = 0, i.e. x[0:4]
    assert _native.sampled_chunk_importance(x, 64) == [pytest.approx(8.0)]
    x[:] = 0
    x[5] = 1.0  # block 1: outside the sample
    assert _native.sampled_chunk_importance(x, 64) == [0.0]
