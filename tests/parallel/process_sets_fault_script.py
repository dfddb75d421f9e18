"""A failing rank with collectives pending in several process sets, run by
test_process_sets.py (3 or 4 ranks; even set {0, 2}, odd set {1, 3}).

Rank 1 (odd set) fails after a first round: argv[1] "raise" (an uncaught
exception) or "dead" (os._exit without a word). Meanwhile rank 0 waits on an
even-set allreduce that rank 2 never submits (rank 2 waits on a global one
first), and rank 3 on an odd-set one. Every survivor must raise: rank 0's
only way out is the failure crossing from the global engine to its even-set
engine (Note [Process sets]). Prints "rank R raised after T s: ...".
"""
import os
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
even = gf.add_process_set([r for r in range(N) if r % 2 == 0])
odd = gf.add_process_set([r for r in range(N) if r % 2 == 1])
mine = even if R % 2 == 0 else odd
assert (gf.allreduce(np.ones(4), op=gf.Sum, name="warm", process_set=mine) == len(mine.ranks)).all()
gf.allreduce(np.ones(4), name="warm.global")

if R == 1:
    time.sleep(0.5)  # the others are waiting by now
    if sys.argv[1] == "raise":
        raise ValueError("boom on rank 1")
    os._exit(3)
t0 = time.time()
try:
    if R == 2:
        gf.allreduce(np.ones(4), name="second.global")
        gf.allreduce(np.ones(4), name="second.set", process_set=mine)
    else:
        gf.allreduce(np.ones(4), name="second.set", process_set=mine)
except gf.GradflowError as e:
    # One write per line: mpiexec interleaves the ranks' output at write
    # boundaries (a print's text and its newline once arrived apart).
    msg = str(e).replace("\n", " ")
    sys.stdout.flush()
    os.write(1, f"rank {R} raised after {time.time() - t0:.2f} s: {msg}\n".encode())
    sys.exit(7)
print(f"rank {R}: no error", flush=True)
