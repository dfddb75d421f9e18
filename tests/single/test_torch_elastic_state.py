"""gradflow.torch.elastic without a job: ElasticSampler's partitions (every
rank yields the same number of samples, whatever is left of the epoch) and
TorchState's GradScaler handling (saved, restored and replaced in place;
a DistributedOptimizer's grad_scaler= joins the state by itself)."""
import math
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from gradflow import _runtime  # noqa: E402
from gradflow.torch import elastic  # noqa: E402


def sampler_for(monkeypatch, n, size, rank, processed, shuffle):
    monkeypatch.setattr(_runtime, "is_initialized", lambda: True)
    monkeypatch.setattr(_runtime, "size", lambda: size)
    monkeypatch.setattr(_runtime, "rank", lambda: rank)
    s = elastic.ElasticSampler(list(range(n)), shuffle=shuffle, seed=3)
    s.load_state_dict({"epoch": 1, "processed_num": processed})
    return s


@pytest.mark.parametrize("shuffle", [False, True])
def test_sampler_gives_every_rank_the_same_count(monkeypatch, shuffle):
    """Any dataset size, group size and point in the epoch (a group that grew
    with fewer samples left than ranks included: 1 left, 3 ranks used to give
    1, 1, 0 and a rank with fewer batches stalls the others): every rank
    yields exactly len() == ceil(left / size) samples; together they cover
    every remaining sample, and repeat only padding (like torch's
    DistributedSampler, which wraps around as often as needed)."""
    checked = 0
    for n in (1, 2, 5, 7, 16, 33):
        for size in range(1, 9):
            for processed in sorted({0, 1, n // 2, max(n - size, 0), max(n - 2, 0), n - 1, n}):
                parts = [list(sampler_for(monkeypatch, n, size, r, processed, shuffle))
                         for r in range(size)]
                left = sampler_for(monkeypatch, n, size, 0, processed, shuffle).remaining_indices
                want = math.ceil(len(left) / size)
                lens = [len(sampler_for(monkeypatch, n, size, r, processed, shuffle))
                        for r in range(size)]
                assert [len(p) for p in parts] == [want] * size == lens, (n, size, processed, parts)
                seen = Counter(i for p in parts for i in p)
                assert set(seen) == set(left), (n, size, processed, parts)
                assert sum(seen.values()) - len(left) == want * size - len(left) < size
                checked += 1
    assert checked > 200
