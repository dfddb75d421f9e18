"""Model of the recursive-doubling allreduce (native/recursive_doubling_allreduce.cc):
which partial sums meet, in which operand order, and where the 16-bit wire
rounds. Works on numpy arrays and torch tensors alike (only `+` and `rnd`)."""


def _fold(n):
    """(p2, rem): the largest power of two <= n and the ranks folded into it."""
    p2 = 1
    while p2 * 2 <= n:
        p2 *= 2
    return p2, n - p2


def recursive_doubling(vals, rnd=lambda v: v):
    """The result every rank holds after reducing vals[rank] (a sum) with
    recursive doubling; `rnd` rounds to the wire (identity on a native wire).
    Fold: even rank r < 2*rem hands its data to r+1; doubling among the rest
    (renumbered), partner = new rank XOR mask; each exchange computes
    rnd(lower rank's partial) + rnd(higher rank's partial); the result is
    rounded once more."""
    n = len(vals)
    p2, rem = _fold(n)
    cur = dict(enumerate(vals))
    for r in range(0, 2 * rem, 2):
        cur[r + 1] = rnd(cur[r]) + rnd(cur[r + 1])
    active = [r for r in range(n) if not (r < 2 * rem and r % 2 == 0)]
    mask = 1
    while mask < p2:
        nxt = {}
        for me, r in enumerate(active):
            peer = active[me ^ mask]
            lo, hi = min(r, peer), max(r, peer)
            nxt[r] = rnd(cur[lo]) + rnd(cur[hi])
        cur = nxt
        mask <<= 1
    return rnd(cur[active[0]])


def bytes_sent(rank, n, message_bytes):
    """What one rank sends in one recursive-doubling allreduce."""
    p2, rem = _fold(n)
    steps = p2.bit_length() - 1
    if rank < 2 * rem and rank % 2 == 0:
        return message_bytes  # folded out: its data, once
    return message_bytes * (steps + (1 if rank < 2 * rem else 0))  # + the result back
