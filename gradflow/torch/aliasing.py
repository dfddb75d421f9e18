# aliasing.py — the memory-overlap check of the torch binding's in-place
# grouped collectives (grouped_allreduce_ and its async form): a pure
# function of the tensors' byte ranges, no communication.
"""Refuse in-place grouped collectives whose tensors share memory."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


def _byte_span(t: torch.Tensor) -> Tuple[int, int]:
    """[first, end) addresses of the bytes `t`'s elements cover (strides >= 0)."""
    size = t.element_size()
    extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * size


def _shares_bytes(tensors: Sequence[torch.Tensor], lo: int, hi: int) -> Optional[int]:
    """Exact test for tensors whose spans all lie in [lo, hi): index of the
    first one touching a byte an earlier one touches, else None. One byte
    map of the span (strided views such as x[0::2] and x[1::2] interleave
    without sharing a byte)."""
    marks = torch.zeros(hi - lo, dtype=torch.uint8)
    for i, t in enumerate(tensors):
        size = t.element_size()
        view = marks.as_strided(list(t.shape) + [size], [st * size for st in t.stride()] + [1],
                                t.data_ptr() - lo)
        if bool(view.any()):
            return i
        view.fill_(1)
    return None


def check_no_aliasing(tensors: Sequence[torch.Tensor], what: str) -> None:
    """ValueError unless the tensors of an in-place grouped collective are
    pairwise disjoint in memory. The core writes each result into its
    tensor's memory, so the same tensor twice, or overlapping views, came
    out reduced once or twice depending on sizes and fusion. Run before
    anything is submitted or named: every rank, given the same list, raises
    alike and nothing is left pending."""
    spans = []
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and not t.is_sparse and t.numel() > 0:
            spans.append((str(t.device), *_byte_span(t), i))
    spans.sort()
    cluster: List[Tuple[str, int, int, int]] = []  # spans overlapping one another, sorted
    end = 0  # the cluster's last byte + 1
    for span in spans + [("", 0, 0, -1)]:  # sentinel closes the last cluster
        if cluster and span[0] == cluster[0][0] and span[1] < end:
            cluster.append(span)
            end = max(end, span[2])
            continue
        if len(cluster) > 1:  # spans overlap: are bytes shared?
            members = [tensors[c[3]] for c in cluster]
            hit = _shares_bytes(members, cluster[0][1], end)
            if hit is not None:
                j = cluster[hit][3]
                i = next(c[3] for c in cluster[:hit]
                         if _shares_bytes([tensors[c[3]], tensors[j]], *_pair(c, cluster[hit]))
                         is not None)
                i, j = min(i, j), max(i, j)
                same = tensors[i] is tensors[j]
                raise ValueError(
                    f"gradflow: {what}: tensors {i} and {j} of the list "
                    f"{'are the same tensor' if same else 'share memory (overlapping views)'}; an "
                    "in-place grouped collective writes each result into its tensor, so they must "
                    "not overlap: pass each tensor once, or use the out-of-place form")
        cluster, end = [span], span[2]


def _pair(a: Tuple[str, int, int, int], b: Tuple[str, int, int, int]) -> Tuple[int, int]:
    return min(a[1], b[1]), max(a[2], b[2])
