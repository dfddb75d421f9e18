# csc_ops_script.py — SPMD (test_collectives.py, GRADFLOW_SPARSE_RATIO=0.1):
# CSC is for sums (native Note [CSC sums only]). Checks on every rank:
# allreduce with op Min, Max and Product stays dense under the setting and
# equals numpy exactly (before: 67 % of a 100000-element Max came back 0,
# alike on every rank); an explicit sparse_ratio < 1 with them is a
# ValueError naming the op; Sum still goes sparse (fewer bytes than dense).
import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
n = 100_000
xs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(N)]
x = xs[R]
for step in range(3):  # the residual would build up from step 2 on
    got = gf.allreduce(x, op=gf.Max, name="metric.max")
    np.testing.assert_array_equal(got, np.max(xs, axis=0))
    got = gf.allreduce(x, op=gf.Min, name="metric.min")
    np.testing.assert_array_equal(got, np.min(xs, axis=0))
    small = (x[:1000] / 4 + 1).astype(np.float32)
    got = gf.allreduce(small, op=gf.Product, name="metric.prod")
    ref = np.ones(1000, np.float32)
    for r in range(N):  # the core multiplies in rank order
        ref = ref * (xs[r][:1000] / 4 + 1).astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
for op in (gf.Min, gf.Max, gf.Product):
    try:
        gf.allreduce(x, op=op, name=f"explicit.{op.name}", sparse_ratio=0.1)
    except ValueError as e:
        assert "sparse_ratio 0.1 with op=" in str(e) and "not supported" in str(e), e
    else:
        raise AssertionError(f"sparse_ratio=0.1 with {op} was accepted")
dense = 3 * 2 * 4 * n * (N - 1) / N  # bytes a rank sends in 3 dense ring allreduces
gf.reset_stats()
for step in range(3):
    gf.allreduce(x, op=gf.Max, name="metric.max")
stats = gf.stats()
assert "sparse.steps" not in stats and stats["bytes_sent"] >= 0.99 * dense, stats
gf.reset_stats()
for step in range(3):  # chunks (after GRADFLOW_SPARSE_WARMUP_STEPS dense ones)
    gf.allreduce(x, op=gf.Sum, name="grad")
stats = gf.stats()
assert stats["sparse.steps"] >= 2 and stats["bytes_sent"] < 0.8 * dense, stats
print(f"ok csc ops on rank {R}", flush=True)
gf.shutdown()
