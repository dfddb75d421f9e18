"""The cost model's pure functions (benchmarks/_costmodel.py, used by benchmarks/scale_model.py): ring-time limits, bucket and CSC
chunk arithmetic against what gradflow measured, the fit recovering known parameters, and the
step simulation's monotonicity. No measurement, no MPI."""
import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("_costmodel", os.path.join(ROOT, "benchmarks", "_costmodel.py"))
sm = importlib.util.module_from_spec(_spec)
sys.modules["_costmodel"] = sm   # dataclasses look their module up there
_spec.loader.exec_module(sm)

pytest.importorskip("scipy")


def test_ring_time_limits():
    bw, lat = 1e9, 1e-5
    assert sm.ring_time(1 << 20, 1, bw, lat, overhead=1.0) == 0.0          # one rank sends nothing
    # two ranks: each sends the whole buffer once, 2 messages
    assert sm.ring_time(1e6, 2, bw, lat, 3e-4) == pytest.approx(3e-4 + 2 * lat + 1e6 / bw)
    # many ranks: the bandwidth term tends to 2 x bytes / bandwidth, latency grows linearly
    big = sm.ring_time(1e9, 10_000, bw, 0.0)
    assert big == pytest.approx(2.0, rel=1e-3) and big < 2.0
    assert sm.ring_time(0, 9, bw, lat) == pytest.approx(16 * lat)
    assert sm.ring_time(1e6, 4, bw, lat) < sm.ring_time(1e6, 8, bw, lat)


def test_fit_recovers_known_parameters():
    bw, lat, ovh = 117e6, 4e-4, 2e-3
    rng = np.random.default_rng(1)
    pts = [(n, float(b), sm.ring_time(b, n, bw, lat, ovh) * (1 + 0.002 * rng.standard_normal()))
           for n in (2, 4, 8) for b in (1 << 16, 1 << 20, 1 << 24, 1 << 26)]
    fbw, flat, fovh = sm.fit_ring(pts)
    assert fbw == pytest.approx(bw, rel=0.01)
    assert flat == pytest.approx(lat, rel=0.15)
    assert fovh == pytest.approx(ovh, rel=0.15)


def test_fit_never_negative():
    # pure bandwidth data: latency and overhead come out 0, not negative
    pts = [(n, float(b), 2.0 * (n - 1) / n * b / 1e8) for n in (2, 4) for b in (1e6, 1e7, 1e8)]
    fbw, flat, fovh = sm.fit_ring(pts)
    assert fbw == pytest.approx(1e8, rel=1e-6) and flat >= 0 and fovh >= 0


def test_model_sizes():
    assert sum(sm.mlp_tensors()) == 25_185_290          # _trainbench WideMLP (scaling.json "params")
    assert sum(sm.SMALL_RESNET_TENSORS) == 308_650
    assert sum(sm.alexnet_tensors()) == 61_100_840      # torchvision alexnet
    assert sum(sm.resnet50_tensors()) == 25_557_032     # torchvision resnet50


def test_buckets_reverse_order_whole_tensors():
    assert sm.make_buckets([10, 20, 30], cap_bytes=4 * 50) == [50, 10]     # 30+20 | 10
    assert sm.make_buckets([5, 1000, 5], cap_bytes=4 * 100) == [5, 1000, 5]  # too big: alone
    mlp = sm.make_buckets(sm.mlp_tensors(), sm.POOL_BUCKET_BYTES)
    assert len(mlp) == 6 and sum(mlp) == 25_185_290    # scaling.json: sparse.steps / steps = 6


def test_csc_chunks_match_measured_bytes():
    # scaling.json, mlp, gf-csc0.01, N = 2: 13 chunks and 12525012 bytes over 9 steps per rank
    sent = [sm.csc_sent_elems(b, 0.01) for b in sm.make_buckets(sm.mlp_tensors(), sm.POOL_BUCKET_BYTES)]
    assert sum(math.ceil(0.01 * c) for c, _ in sent) == 13
    payload = sum(4 * e for _, e in sent) + sum(4 * c for c, _ in sent)
    assert payload == pytest.approx(12525012 / 9, rel=0.001)
    assert sm.csc_sent_elems(100, 0.01) == (1, 100)     # a bucket smaller than a chunk is sent whole


def test_step_time_overlap_and_n1():
    link = sm.Link(bandwidth=1e8, latency=1e-4, overhead=0.0)
    t = sm.mlp_tensors()
    dense = sm.System("x", sm.POOL_BUCKET_BYTES)
    one = sm.step_time(t, 1, sm.System("x", 8 << 20, cpu_s_per_elem=1e-9), link, 0.2)
    assert one.step == pytest.approx(0.2 + 1e-9 * sum(t)) and one.bytes_per_rank == 0
    full = sm.step_time(t, 4, dense, link, 0.2)
    none = sm.step_time(t, 4, sm.System("x", sm.POOL_BUCKET_BYTES, overlap=0.0), link, 0.2)
    assert none.step == pytest.approx(0.2 + none.comm)                 # nothing hidden
    assert full.step < none.step and full.step >= none.comm            # hidden up to backward, not more
    assert none.step - full.step <= sm.BACKWARD_SHARE * 0.2 + 1e-12
    fp16 = sm.step_time(t, 4, sm.System("x", sm.POOL_BUCKET_BYTES, wire_bytes=2), link, 0.2)
    assert fp16.bytes_per_rank == pytest.approx(none.bytes_per_rank / 2)
    csc = sm.step_time(t, 4, sm.System("x", sm.POOL_BUCKET_BYTES, sparse_ratio=0.01), link, 0.2)
    assert csc.bytes_per_rank < none.bytes_per_rank / 50 and csc.collectives == 2 * none.collectives


def test_coordination_terms_only_with_peers():
    link = sm.Link(bandwidth=1e8, latency=0.0, overhead=0.0)
    t = sm.mlp_tensors()
    base = sm.System("x", sm.POOL_BUCKET_BYTES, sparse_ratio=0.01, overlap=0.0)
    coord = sm.System("x", sm.POOL_BUCKET_BYTES, sparse_ratio=0.01, overlap=0.0,
                      coord_step_s=0.01, coord_collective_s=0.002)
    assert sm.step_time(t, 1, coord, link, 0.2).step == sm.step_time(t, 1, base, link, 0.2).step
    a = sm.step_time(t, 2, base, link, 0.2, contention=1.5)
    b = sm.step_time(t, 2, coord, link, 0.2, contention=1.5)
    assert b.step - a.step == pytest.approx((0.01 + 0.002 * a.collectives) * 1.5)


def test_csc_cpu_per_sent_element():
    # The current code's CSC work: s_s per element sent on top of s_b per gradient element.
    link = sm.Link(bandwidth=1e8, latency=0.0, overhead=0.0)
    t = sm.mlp_tensors()
    base = sm.System("x", sm.POOL_BUCKET_BYTES, sparse_ratio=0.1, overlap=0.0, cpu_s_per_elem=1e-10)
    more = sm.System("x", sm.POOL_BUCKET_BYTES, sparse_ratio=0.1, overlap=0.0, cpu_s_per_elem=1e-10,
                     cpu_s_per_sent_elem=2e-9)
    sent = sum(sm.csc_sent_elems(b, 0.1)[1] for b in sm.make_buckets(t, sm.POOL_BUCKET_BYTES))
    assert 0 < sent < sum(t) / 5
    a = sm.step_time(t, 4, base, link, 0.2, contention=1.5)
    b = sm.step_time(t, 4, more, link, 0.2, contention=1.5)
    assert b.step - a.step == pytest.approx(2e-9 * sent * 1.5)
    dense = sm.System("x", sm.POOL_BUCKET_BYTES, overlap=0.0, cpu_s_per_sent_elem=2e-9)
    assert sm.step_time(t, 4, dense, link, 0.2).cpu == 0.0   # dense buckets send no CSC chunks


def test_ddp_hook_pooled_over_models():
    # A few ms of noise on the 0.3 M-parameter ResNet must not become the per-element
    # cost of the 25 M-parameter MLP (a maximum of per-model ratios made it 10 ns).
    spec = importlib.util.spec_from_file_location("scale_model", os.path.join(ROOT, "benchmarks", "scale_model.py"))
    model = importlib.util.module_from_spec(spec)
    sys.modules["scale_model"] = model   # dataclasses look their module up there
    saved = list(sys.path)
    try:
        spec.loader.exec_module(model)   # it puts benchmarks/ on sys.path
    finally:
        sys.path[:] = saved

    def row(step, params):
        return {"step_seconds_median": step, "params": params}
    rows = {("mlp", "ddp", 1): row(0.150, 25_185_290), ("mlp", "ddp-fp16", 1): row(0.175, 25_185_290),
            ("resnet", "ddp", 1): row(0.076, 308_650), ("resnet", "ddp-fp16", 1): row(0.080, 308_650)}
    got = model.ddp_hook_s_per_elem(rows)
    assert got == pytest.approx(0.029 / (25_185_290 + 308_650))
    assert 1.0e-9 < got < 1.2e-9
    assert model.ddp_hook_s_per_elem({}) == 0.0
