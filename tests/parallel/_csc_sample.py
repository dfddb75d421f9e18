"""The sample rule of native/sparse_pool_residual.h (sampled_chunk_importance)
in numpy, for the CSC models of torch_csc_script.py and
tests/single/test_sparse_selection.py."""


def sample_blocks(c, length, chunk, phase):
    """(lo, hi) ranges sampled in chunk c (`length` elements, chunk size
    `chunk`) at sparse step `phase`: blocks of max(1, chunk // 16); in each
    group g of 8 blocks (the last may have m < 8) block 8g + (c + 3g + phase % 8) % m."""
    b = max(1, chunk // 16)
    nb = -(-length // b)
    out = []
    for g in range(-(-nb // 8)):
        j = 8 * g + (c + 3 * g + phase % 8) % min(8, nb - 8 * g)
        out.append((j * b, min(j * b + b, length)))
    return out
