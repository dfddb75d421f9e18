# shutdown_names_rank_script.py — SPMD (test_lifecycle.py, 3 ranks): a rank
# that calls shutdown() while the others still run collectives is named in
# the error the others get; in a process set by its member index, as every
# set error counts (the prefix says so). Prints "ok <case> on rank R" on
# each waiting rank.
"""Case `global`: rank 1 shuts down; ranks 0 and 2 wait in a global
allreduce rank 1 never submits. Case `set`: set {1, 2} (rank 2 is the
set's member 1); rank 2 shuts down while rank 1 waits in a set allreduce,
and rank 0 waits in nothing. Case `set_late`: the same, but rank 1 submits
only after the set's engine has failed (the error comes from submit, not
wait: it lacked the prefix's member-count note, so "rank 1" read as the
global rank 1 reading it; seen in CI, 2026-11-29). Before 2026-11-29 the
error said "on some rank"."""
import time
import sys

import numpy as np

import gradflow as gf

CASE = sys.argv[1]
gf.init()
R = gf.rank()
if CASE == "global":
    quitter, waiters, ps = 1, (0, 2), None
else:
    ps = gf.add_process_set([1, 2])
    quitter, waiters = 1, (1,)  # the quitter: global rank 2, the set's member 1
gf.barrier()
if R == (quitter if ps is None else 2):
    gf.shutdown()
elif R in waiters:
    if CASE == "set_late":
        time.sleep(2)  # rank 2's shutdown reaches this rank's set engine first
    try:
        gf.allreduce(np.ones(4), name="never", process_set=ps)
    except gf.GradflowError as e:
        text = str(e)
        assert f"shutdown() was called on rank {quitter} before this collective ran" in text, text
        if ps is not None:
            assert "process set 1 (ranks [1, 2]; 'rank i' and 'root=i' below count its members)" \
                in text, text
        print(f"ok {CASE} on rank {R}", flush=True)
    else:
        raise AssertionError(f"rank {R}: the allreduce did not fail")
