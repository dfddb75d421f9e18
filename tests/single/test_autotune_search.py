"""The autotune search (gradflow/autotune_search.py) on made-up step times,
and its settings' validation (native/config.cc, native/tuning.cc). No MPI."""
import pytest

from gradflow import _native
from gradflow import autotune_search as S

START = S.Setting("ring", 8 << 20, 1 << 20, 1.0)


def run(search, cost):
    """Feed `cost(setting)` for every sample until the search is done."""
    for _ in range(200):
        if search.done():
            return search.final
        search.report(cost(search.current()))
    raise AssertionError("search did not finish in 200 samples")


def test_finds_the_fastest_point_of_a_separable_cost():
    def cost(s):
        return (1.0 + {"ring": 0.3, "two-sync": 0.0, "mpi": 0.2}[s.allreduce_algo]
                + abs(s.pool_bucket_bytes - (2 << 20)) / (8 << 20)
                + abs(s.cycle_time_ms - 5.0) / 100)
    search = S.Search(START, warmup_samples=2, bucket_sizes=[1 << 20, 2 << 20, 16 << 20])
    final = run(search, cost)
    assert final == S.Setting("two-sync", 2 << 20, 1 << 20, 5.0)
    phases = [s.phase for s in search.samples]
    assert phases[:2] == ["warmup", "warmup"] and phases[2] == "search"
    assert phases[-4:] == ["confirm"] * 4
    # two-sync won, so the ring piece size was never tried
    assert all(s.setting.ring_pipeline_bytes == 1 << 20 for s in search.samples)


def test_ring_piece_size_tried_when_ring_wins():
    def cost(s):
        return 1.0 + (0 if s.allreduce_algo == "ring" else 1) + \
            (0 if s.ring_pipeline_bytes == 2 << 20 else 0.1)
    final = run(S.Search(START, 0, []), cost)
    assert final.allreduce_algo == "ring" and final.ring_pipeline_bytes == 2 << 20


def test_noise_below_min_gain_keeps_the_start():
    # every other setting is 1 % faster: within min_gain (2 %), not a reason to move
    final = run(S.Search(START, 0, [1 << 20]), lambda s: 1.0 if s == START else 0.99)
    assert final == START


def test_confirmation_falls_back_to_the_start():
    # a setting that looked fast once but is slow when timed again
    seen = {}

    def cost(s):
        seen[s] = seen.get(s, 0) + 1
        if s.allreduce_algo == "mpi":
            return 0.5 if seen[s] == 1 else 2.0
        return 1.0
    search = S.Search(START, 0, [])
    assert run(search, cost) == START
    assert any(s.phase == "confirm" and s.setting.allreduce_algo == "mpi"
               for s in search.samples)


def test_ring_pieces_never_below_the_default():
    search = S.Search(START, 0, [])
    run(search, lambda s: 1.0 if s.allreduce_algo == "ring" else 2.0)
    assert {s.setting.ring_pipeline_bytes for s in search.samples} == {1 << 20, 2 << 20, 4 << 20}


def test_deterministic():
    cost = lambda s: 1.0 + hash((s.allreduce_algo, s.pool_bucket_bytes, s.cycle_time_ms)) % 7 / 10
    a, b = S.Search(START, 1, [1 << 20]), S.Search(START, 1, [1 << 20])
    assert run(a, cost) == run(b, cost)
    assert [x.setting for x in a.samples] == [x.setting for x in b.samples]


def test_encode_decode_roundtrip():
    for final in (False, True):
        values = START.encode(final)
        assert len(values) == 5
        assert S.Setting.decode(values) == (START, final)


def test_distinct_bucket_sizes_follow_the_pool_cut():
    mib = 1 << 20
    ranges = [[3 * mib, 3 * mib, 3 * mib, 10 * mib]]
    # start 8 MiB cuts 3+3 | 3 | 10; 1 and 2 MiB cut every range apart (same cut: 1 kept);
    # 4 MiB is the same cut as 1 MiB; 16 MiB: 3+3+3 | 10; 32 and 64 MiB: one bucket
    kept = S.distinct_bucket_sizes(ranges, [m * mib for m in S.BUCKET_MIB], 8 * mib)
    assert kept == [1 * mib, 16 * mib, 32 * mib]
    assert S.distinct_bucket_sizes([], [mib], 8 * mib) == []


@pytest.mark.parametrize("env,value,fragment", [
    ("GRADFLOW_AUTOTUNE", "maybe", "not a boolean"),
    ("GRADFLOW_AUTOTUNE_WARMUP_SAMPLES", "-1", "out of range"),
    ("GRADFLOW_AUTOTUNE_WARMUP_SAMPLES", "1.5", "not an integer"),
    ("GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", "0", "out of range"),
    ("GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", "x", "not a number"),
])
def test_bad_autotune_settings_rejected(env, value, fragment):
    with pytest.raises(_native.GradflowError) as e:
        _native.validate_config({env: value})
    assert fragment in str(e.value) and env in str(e.value)


def test_autotune_flags_are_horovods():
    keys = {k["env"]: k for k in _native.config_keys()}
    assert keys["GRADFLOW_AUTOTUNE"]["flag"] == "--autotune"
    assert keys["GRADFLOW_AUTOTUNE_LOG"]["flag"] == "--autotune-log-file"
    assert keys["GRADFLOW_AUTOTUNE_WARMUP_SAMPLES"]["default"] == "3"
    assert keys["GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE"]["default"] == "10"
