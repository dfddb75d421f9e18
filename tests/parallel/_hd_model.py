"""Model of the halving-doubling allreduce (native/halving_doubling_allreduce.cc):
which partial sums meet, in which operand order, and where the 16-bit wire
rounds. Works on 1-D numpy arrays (only slicing, `combine` and `rnd`)."""
import numpy as np

from _rd_model import _fold  # the same fold as recursive doubling


def _block_offsets(count, p2):
    base, extra = divmod(count, p2)
    return [b * base + min(b, extra) for b in range(p2 + 1)]


def halving_doubling(vals, combine=lambda mine, theirs: mine + theirs, rnd=lambda v: v):
    """The result every rank holds after reducing vals[rank] with
    halving-doubling. `combine(mine, theirs)` is the receiver's reduction
    (mine = its own partial); `rnd` rounds what travels to the wire (identity
    on a native wire). Fold: even rank r < 2*rem sends rnd(its data) to r+1.
    Reduce-scatter among the rest (renumbered "me"): for mask = p2/2 .. 1 a
    rank keeps the half of its run of blocks picked by bit `mask` of me and
    combines rnd(partner's partial) into it. Owner `me` ends with block me
    and rounds it once: the result."""
    n = len(vals)
    p2, rem = _fold(n)
    cur = {r: np.array(v, copy=True) for r, v in enumerate(vals)}
    for r in range(0, 2 * rem, 2):
        cur[r + 1] = combine(cur[r + 1], rnd(cur[r]))
    active = [r for r in range(n) if not (r < 2 * rem and r % 2 == 0)]
    count = len(vals[0])
    off = _block_offsets(count, p2)
    lo = {me: 0 for me in range(p2)}
    blocks = p2
    mask = p2 // 2
    while mask >= 1:
        half = blocks // 2
        new = {}
        for me, r in enumerate(active):
            keep = lo[me] + half if me & mask else lo[me]
            sl = slice(off[keep], off[keep + half])
            partner = active[me ^ mask]
            part = cur[r].copy()
            part[sl] = combine(cur[r][sl], rnd(cur[partner][sl]))
            new[r] = part
            lo[me] = keep
        cur = new
        blocks = half
        mask //= 2
    out = np.empty_like(cur[active[0]])
    for me, r in enumerate(active):
        sl = slice(off[me], off[me + 1])
        out[sl] = rnd(cur[r][sl])
    return out


def bytes_sent(rank, n, message_bytes, elem_bytes):
    """What one rank sends in one halving-doubling allreduce of
    message_bytes (elements of elem_bytes on the wire)."""
    p2, rem = _fold(n)
    if rank < 2 * rem and rank % 2 == 0:
        return message_bytes  # folded out: its data, once
    me = rank // 2 if rank < 2 * rem else rank - rem
    off = [o * elem_bytes for o in _block_offsets(message_bytes // elem_bytes, p2)]
    sent, lo, blocks, mask = 0, 0, p2, p2 // 2
    while mask >= 1:  # reduce-scatter: the half the partner keeps
        half = blocks // 2
        keep = lo + half if me & mask else lo
        give = lo if me & mask else lo + half
        sent += off[give + half] - off[give]
        lo, blocks, mask = keep, half, mask // 2
    blocks, mask = 1, 1
    while mask < p2:  # allgather: the run held
        sent += off[lo + blocks] - off[lo]
        lo = min(lo, lo ^ mask)
        blocks, mask = blocks * 2, mask * 2
    return sent + (message_bytes if rank < 2 * rem else 0)  # + the result back
