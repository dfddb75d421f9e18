"""fp16/bf16 wire codec: SIMD and scalar paths agree bitwise, match numpy's
round-to-nearest-even, and overflow is flagged (never silently wrong)."""
import numpy as np
import pytest

from gradflow import _native

FP16, BF16 = 1, 2


def all_paths():
    paths = [False]
    if _native.codec_simd_available():
        paths.append(True)
    return paths


@pytest.fixture(autouse=True)
def restore_simd():
    yield
    _native.set_codec_simd_enabled(True)


def sample_floats(n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    edge = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 1e5, -1e5, 6.1e-5, 5.96e-8,
                     2.98e-8, 1e-10, np.inf, -np.inf, 3.4e38, 1.17e-38], np.float32)
    wide = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 12, n))).astype(np.float32)
    return np.concatenate([edge, wide])


@pytest.mark.parametrize("simd", all_paths())
def test_fp16_encode_matches_numpy(simd):
    _native.set_codec_simd_enabled(simd)
    x = sample_floats()
    enc, _ = _native.encode_f32(FP16, x)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(enc, ref)


@pytest.mark.parametrize("simd", all_paths())
def test_fp16_decode_all_patterns(simd):
    _native.set_codec_simd_enabled(simd)
    bits = np.arange(65536, dtype=np.uint16)
    got = _native.decode_f32(FP16, bits)
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_simd_and_scalar_agree_bitwise():
    if not _native.codec_simd_available():
        pytest.skip("CPU has no AVX2/F16C: only the scalar path exists here")
    x = sample_floats(seed=1)
    bits = np.arange(65536, dtype=np.uint16)
    out = {}
    for simd in (False, True):
        _native.set_codec_simd_enabled(simd)
        out[simd] = [_native.encode_f32(w, x)[0] for w in (FP16, BF16)] + \
                    [_native.decode_f32(w, bits).view(np.uint32) for w in (FP16, BF16)]
    for a, b in zip(out[False], out[True]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("simd", all_paths())
def test_bf16_round_to_nearest_even(simd):
    _native.set_codec_simd_enabled(simd)
    x = sample_floats(seed=2)
    enc, _ = _native.encode_f32(BF16, x)
    u = x.view(np.uint32).astype(np.uint64)
    ref = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # RNE on finite values
    finite = np.isfinite(x)
    np.testing.assert_array_equal(enc[finite], ref[finite])
    back = _native.decode_f32(BF16, enc)
    inside = finite & (np.abs(x) < 3.38e38)  # above bf16's largest finite value rounds to inf
    assert np.all(np.abs(back[inside] - x[inside]) <= np.abs(x[inside]) * 2 ** -8 + 1e-38)
    assert np.isinf(back[np.abs(x) > 3.3961e38]).all()


@pytest.mark.parametrize("simd", all_paths())
def test_overflow_is_flagged(simd):
    _native.set_codec_simd_enabled(simd)
    enc, overflow = _native.encode_f32(FP16, np.array([1.0, 70000.0], np.float32))
    assert overflow and np.isinf(enc.view(np.float16)[1])
    _, overflow = _native.encode_f32(FP16, np.array([1.0, 65504.0, np.inf], np.float32))
    assert not overflow  # inf was already inf: not an overflow of the wire


def test_decode_accumulate_sums_in_fp32():
    x = sample_floats(1000, seed=3)[20:]
    x = x[np.abs(x) < 60000]
    acc = np.full(x.size, 0.25, np.float32)
    enc, _ = _native.encode_f32(FP16, x)
    _native.decode_accumulate_f32(FP16, enc, acc)
    np.testing.assert_array_equal(acc, np.float32(0.25) + enc.view(np.float16).astype(np.float32))
