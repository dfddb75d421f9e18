"""Process sets with the numpy API, run by test_process_sets.py on 2-4 ranks.

Modes (argv[1]):
  collectives  even / odd / overlapping sets: every collective per set
               against numpy, bitwise identical within the set, the global
               set still right in between; ProcessSet's size/rank/included.
  concurrent   disjoint sets run at once: while one set's members hold back
               (sleep), the other set's async collectives complete; a rank in
               two overlapping sets has collectives pending in both at once.
  init         init(process_sets=[...]) registers the sets in order.
  initlist     init(comm=[ranks]): only the listed world ranks form gradflow.
  errors       remove then use, mismatched / invalid / duplicate registration,
               non-member calls, a root outside the set, mismatched shapes in
               a set: a ValueError / GradflowError naming the set on every rank
               that took part, and everything still works afterwards.
Prints "<mode> OK on N ranks" from rank 0.
"""
import sys
import time

import numpy as np

import gradflow as gf
from _exact_checks import same_everywhere

MODE = sys.argv[1]
if MODE == "initlist":  # Horovod's init(comm=[ranks]): the last N-1 world ranks only
    from mpi4py import MPI
    W, WN = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    members = list(range(1, WN))[::-1]  # any order: sorted by init
    if W == 0:
        try:
            gf.init(comm=members)
            raise AssertionError("rank 0 is not in comm= but init() accepted it")
        except ValueError as e:
            assert "not in comm=" in str(e), e
    else:
        gf.init(comm=members)
        assert (gf.rank(), gf.size()) == (W - 1, WN - 1), (gf.rank(), gf.size())
        got = gf.allreduce(np.array([W]), op=gf.Sum)
        assert int(got[0]) == sum(range(1, WN)), got
        print(f"initlist member {W} OK", flush=True)
        gf.shutdown()
    sys.exit(0)
if MODE == "init":
    _n = __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.Get_size()
    EVEN0 = gf.ProcessSet([r for r in range(_n) if r % 2 == 0])
    ODD0 = gf.ProcessSet([r for r in range(_n) if r % 2 == 1])
    gf.init(process_sets=[EVEN0, ODD0])
else:
    gf.init()
R, N = gf.rank(), gf.size()


def data(rank, shape=(5, 3), dtype=np.float32, salt=0):
    """Rank `rank`'s input, rebuildable by every rank (full-mantissa floats)."""
    rng = np.random.default_rng(1000 * salt + rank)
    return (rng.standard_normal(shape) * 10).astype(dtype)


def expect_error(fn, *needles, kind=Exception):
    try:
        fn()
    except kind as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"rank {R}: {n!r} not in error {msg!r}"
        return msg
    raise AssertionError(f"rank {R}: expected an error containing {needles}")


def check_set(ps, salt):
    """Every collective on `ps` (this rank a member) against numpy."""
    m, k = len(ps.ranks), ps.ranks.index(R)
    assert ps.size() == m and ps.rank() == k and ps.included()
    # allreduce: Sum and Average in float32 (exact check of the set's sum in
    # float64 within rounding), Max/Min and Sum on int64 exactly.
    mine = data(R, salt=salt)
    want = sum(data(q, salt=salt).astype(np.float64) for q in ps.ranks)
    s = gf.allreduce(mine, op=gf.Sum, name=f"s{salt}.sum", process_set=ps)
    assert np.allclose(s, want, rtol=1e-5, atol=1e-4), (R, s, want)
    same_everywhere(s, f"s{salt}.sum", process_set=ps)
    a = gf.allreduce(mine, name=f"s{salt}.avg", process_set=ps)  # Average over the set
    assert np.allclose(a, want / m, rtol=1e-5, atol=1e-4), (R, a, want / m)
    same_everywhere(a, f"s{salt}.avg", process_set=ps)
    ints = (data(R, (7,), salt=salt) * 100).astype(np.int64)
    all_ints = [(data(q, (7,), salt=salt) * 100).astype(np.int64) for q in ps.ranks]
    assert (gf.allreduce(ints, op=gf.Sum, process_set=ps) == sum(all_ints)).all()
    assert (gf.allreduce(ints, op=gf.Max, process_set=ps) == np.max(all_ints, 0)).all()
    h16 = gf.allreduce(mine, op=gf.Sum, compression=gf.Compression.fp16, name=f"s{salt}.fp16",
                       process_set=ps)
    assert np.allclose(h16, want, rtol=2e-2, atol=0.5), (R, h16, want)
    same_everywhere(h16, f"s{salt}.fp16", process_set=ps)
    # allgather: rank q contributes q+1 rows, concatenated in set order.
    rows = lambda q: data(q, (q + 1, 2), salt=salt)  # noqa: E731
    g = gf.allgather(rows(R), process_set=ps)
    assert np.array_equal(g, np.concatenate([rows(q) for q in ps.ranks])), (R, g.shape)
    # broadcast from the set's last member (a global rank, as in Horovod).
    root = ps.ranks[-1]
    b = gf.broadcast(data(R, salt=salt), root_rank=root, process_set=ps)
    assert np.array_equal(b, data(root, salt=salt))
    # alltoall: member q sends j+1 rows to member j; rows carry (sender, receiver).
    send = lambda q: np.concatenate(  # noqa: E731
        [np.full((j + 1, 2), [q, dst], np.int64) for j, dst in enumerate(ps.ranks)])
    out, got = gf.alltoall(send(R), splits=[j + 1 for j in range(m)], process_set=ps)
    assert list(got) == [k + 1] * m, (R, got)
    assert np.array_equal(out, np.concatenate([np.full((k + 1, 2), [q, R]) for q in ps.ranks]))
    # reducescatter: member k keeps block k of the set's sum (earlier get more rows).
    rs_in = lambda q: data(q, (2 * m + 1, 3), np.float64, salt)  # noqa: E731
    total = sum(rs_in(q) for q in ps.ranks)
    blocks = np.array_split(total, m)
    rs = gf.reducescatter(rs_in(R), op=gf.Sum, process_set=ps)
    assert np.allclose(rs, blocks[k], rtol=1e-12, atol=1e-9), (R, rs, blocks[k])
    # Adasum over the set's members: Horovod's two-vector rule for 2 members,
    # the value itself for 1; a member count that is not a power of two is
    # refused on every member, naming the set.
    vec = lambda q: data(q, (40,), np.float64, salt).ravel()  # noqa: E731
    if m in (1, 2):
        ada = gf.allreduce(vec(R), op=gf.Adasum, name=f"s{salt}.adasum", process_set=ps)
        want = vec(ps.ranks[0])
        if m == 2:
            x, y = vec(ps.ranks[0]), vec(ps.ranks[1])
            d = x @ y
            want = (1 - d / (2 * (x @ x))) * x + (1 - d / (2 * (y @ y))) * y
        assert np.allclose(ada, want, rtol=1e-12, atol=1e-12), (R, ada - want)
        same_everywhere(ada, f"s{salt}.adasum", process_set=ps)
    else:
        expect_error(lambda: gf.allreduce(vec(R), op=gf.Adasum, process_set=ps),
                     f"process set {ps.process_set_id}", "power-of-two number of ranks",
                     f"runs on {m} ranks", kind=ValueError)
    gf.barrier(process_set=ps)


def check_global(tag):
    g = gf.allreduce(np.full(3, R, np.int64), op=gf.Sum, name=f"global.{tag}")
    assert (g == sum(range(N))).all(), (R, g)


def sets():
    even = gf.add_process_set([r for r in range(N) if r % 2 == 0])
    odd = gf.add_process_set(gf.ProcessSet([r for r in range(N) if r % 2 == 1]))
    overlap = gf.add_process_set(list(range(1, N))) if N >= 3 else None
    return even, odd, overlap


if MODE == "collectives":
    assert gf.global_process_set.ranks == list(range(N)) and gf.global_process_set.size() == N
    even, odd, overlap = sets()
    assert even.process_set_id == 1 and odd.process_set_id == 2, (even, odd)
    assert even != odd and even == even and gf.global_process_set != even
    assert even.included() == (R % 2 == 0) and odd.included() == (R % 2 == 1)
    check_global("before")
    mine = even if R % 2 == 0 else odd
    for rnd in range(2):  # twice: the second round takes the response cache's fast path
        check_set(mine, salt=1 + rnd)
        check_global(f"mid{rnd}")
        if overlap is not None and overlap.included():
            check_set(overlap, salt=3 + rnd)
    if overlap is not None and not overlap.included():
        expect_error(lambda: overlap.rank(), "not part of process set", kind=ValueError)
    check_global("after")
    if R == 0:
        print(f"collectives OK on {N} ranks", flush=True)

elif MODE == "concurrent":
    even, odd, overlap = sets()
    mine = even if R % 2 == 0 else odd
    # The odd set's members hold back 3 s before submitting; the even set's
    # 20 async allreduces must not wait for them.
    if R % 2 == 1:
        time.sleep(3.0)
    t0 = time.monotonic()
    hs = [gf.allreduce_async(np.full(1000, R + i, np.float32), op=gf.Sum, name=f"c.{i}",
                             process_set=mine) for i in range(20)]
    outs = [h.wait() for h in hs]
    took = time.monotonic() - t0
    for i, o in enumerate(outs):
        assert (o == sum(q + i for q in mine.ranks)).all(), (R, i, o[:3])
    if R % 2 == 0 and N >= 2 and len(odd.ranks) > 0:
        assert took < 2.5, f"rank {R}: the even set waited {took:.2f} s for the odd set"
    if overlap is not None and overlap.included():
        # Pending in two sets at once (and the global one); waited in reverse order.
        a = gf.allreduce_async(np.full(4, R, np.int64), op=gf.Sum, name="both", process_set=mine)
        b = gf.allreduce_async(np.full(4, R, np.int64), op=gf.Sum, name="both",
                               process_set=overlap)
        assert (b.wait() == sum(overlap.ranks)).all() and (a.wait() == sum(mine.ranks)).all()
    elif overlap is not None:
        gf.allreduce(np.full(4, R, np.int64), op=gf.Sum, name="both", process_set=mine)
    g = gf.allreduce_async(np.full(2, R, np.int64), op=gf.Sum, name="g")
    assert gf.poll(g) in (True, False) and (gf.synchronize(g) == sum(range(N))).all()
    if R == 0:
        print(f"concurrent OK on {N} ranks", flush=True)

elif MODE == "init":
    assert EVEN0.process_set_id == 1 and ODD0.process_set_id == 2, (EVEN0, ODD0)
    mine = EVEN0 if R % 2 == 0 else ODD0
    check_set(mine, salt=7)
    check_global("init")
    if R == 0:
        print(f"init OK on {N} ranks", flush=True)

elif MODE == "errors":
    even, odd, overlap = sets()
    mine, other = (even, odd) if R % 2 == 0 else (odd, even)
    # A non-member's call is refused on that rank, naming the set.
    expect_error(lambda: gf.allreduce(np.ones(3), process_set=other),
                 f"process set {other.process_set_id}", "does not include rank", kind=ValueError)
    # A broadcast root outside the set.
    outside = other.ranks[0]
    expect_error(lambda: gf.broadcast(np.ones(2), root_rank=outside, process_set=mine),
                 f"process set {mine.process_set_id}", f"root rank {outside}", kind=ValueError)
    # Mismatched shapes within a set: every member gets the coordinator's error, naming the set.
    if len(mine.ranks) > 1:
        expect_error(lambda: gf.allreduce(np.ones(3 + mine.rank()), name="shapes",
                                          process_set=mine),
                     f"process set {mine.process_set_id}", "shapes", kind=gf.GradflowError)
    # Mismatched registration: every rank raises, saying what each rank passed.
    bad = [0] if R == 0 else [0, N - 1]
    expect_error(lambda: gf.add_process_set(bad), "same ranks", "rank 0: add_process_set([0])",
                 kind=ValueError)
    # An invalid list on one rank: that rank gets its reason, the others are told.
    lst = [0, N] if R == N - 1 else [0]
    msg = expect_error(lambda: gf.add_process_set(lst), kind=ValueError)
    assert ("out of range" in msg) if R == N - 1 else ("invalid rank list" in msg), (R, msg)
    # Duplicates: of an existing set, of the global set.
    expect_error(lambda: gf.add_process_set(list(even.ranks)), "already exists", kind=ValueError)
    expect_error(lambda: gf.add_process_set(list(range(N))), "global process set", kind=ValueError)
    assert gf.remove_process_set(gf.global_process_set) is False
    # Remove, then use: ValueError on every rank (the object is invalidated).
    assert gf.remove_process_set(even) is True
    assert even.process_set_id is None and even.size() is None
    expect_error(lambda: gf.allreduce(np.ones(2), process_set=even), "not registered",
                 kind=ValueError)
    assert gf.remove_process_set(even) is False
    # A set with the removed set's ranks can be added again, under a new id.
    again = gf.add_process_set([r for r in range(N) if r % 2 == 0])
    assert again.process_set_id == (4 if overlap else 3), again  # ids are never reused
    if again.included():
        check_set(again, salt=11)
    if odd.included():
        check_set(odd, salt=12)
    check_global("errors")
    if R == 0:
        print(f"errors OK on {N} ranks", flush=True)
else:
    raise SystemExit(f"unknown mode {MODE}")
gf.shutdown()
