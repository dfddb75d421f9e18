"""numpy model of Adasum (native/adasum_allreduce.h), for the parallel tests.

The pairwise rule, per tensor, with dot products and norms in float64:
  adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
where a coefficient whose squared norm is below sqrt(DBL_MIN) stays 1.
The tree is the one of vector-halving distance-doubling: level 1 combines
ranks (0,1), (2,3), ...; level 2 the results of {0,1} and {2,3}; the lower
ranks' operand is always the left one. Each level's combination is rounded
to the working dtype (float32 for float32/float16/bfloat16 data, float64
for float64), as the core stores it between levels. The core sums dot
products in a different order (per rank slice), so results agree to a
few ulps, not bit for bit."""
from __future__ import annotations

import sys
from typing import List, Sequence

import numpy as np

_TINY = np.sqrt(sys.float_info.min)


def pair(a: np.ndarray, b: np.ndarray, work=np.float32) -> np.ndarray:
    """Adasum of two operands of one tensor (flat arrays of the work dtype)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dot = float(a64 @ b64)
    na, nb = float(a64 @ a64), float(b64 @ b64)
    ca = 1.0 - dot / na * 0.5 if na >= _TINY else 1.0
    cb = 1.0 - dot / nb * 0.5 if nb >= _TINY else 1.0
    return (ca * a64 + cb * b64).astype(work)


def adasum(per_rank: Sequence[Sequence[np.ndarray]], work=np.float32) -> List[np.ndarray]:
    """`per_rank[r]` is rank r's list of tensors; returns the combined list.
    The number of ranks must be a power of two."""
    n = len(per_rank)
    assert n & (n - 1) == 0, n
    level = [[np.asarray(t).reshape(-1).astype(work) for t in ts] for ts in per_rank]
    while len(level) > 1:
        level = [[pair(a, b, work) for a, b in zip(level[i], level[i + 1])]
                 for i in range(0, len(level), 2)]
    return level[0]
