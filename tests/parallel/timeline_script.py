"""Runs a few named collectives with GRADFLOW_TIMELINE set (checked by test_timeline.py).

With args `sets <dir>` (3 ranks) it then runs collectives of process sets
{0, 2} (id 1: rank 0, the writer, is a member) and {1} (id 2: it is not),
stops the timeline, and runs more of both sets and the global set into a
timeline started at run time, <dir>/runtime.json; results checked against numpy.
With arg `reinit` it then calls shutdown() and init() twice, running one
allreduce ("second", then "third") in each new runtime."""
import os
import sys

import numpy as np

import gradflow as gf

gf.init()
R = gf.rank()
for step in range(3):
    hs = [gf.allreduce_async(np.ones(1000 * (k + 1), np.float32), name=f"grad.{k}") for k in range(4)]
    for h in hs:
        h.wait()
    gf.timeline_mark(f"step {step}")
gf.allgather(np.ones((R + 1, 2)), name="gathered")
gf.broadcast(np.ones(3), 0, name="bcast")

if sys.argv[1:2] == ["sets"]:
    assert gf.size() == 3
    out = sys.argv[2]
    even = gf.add_process_set([0, 2])
    lone = gf.add_process_set([1])
    assert (even.process_set_id, lone.process_set_id) == (1, 2)
    x = np.arange(6, dtype=np.float64) * (R + 1)
    # The same names as the global set's: the rows tell the sets apart.
    if R in (0, 2):
        got = gf.allreduce(x, op=gf.Sum, name="grad.0", process_set=even)
        np.testing.assert_array_equal(got, np.arange(6) * (1 + 3))
        got = gf.allgather(np.full((R + 1, 2), R, np.float32), name="gathered", process_set=even)
        np.testing.assert_array_equal(got, np.array([[0, 0], [2, 2], [2, 2], [2, 2]], np.float32))
    else:
        np.testing.assert_array_equal(gf.allreduce(x, op=gf.Sum, name="grad.0", process_set=lone), x)
    gf.stop_timeline()  # closes the GRADFLOW_TIMELINE file
    gf.start_timeline(os.path.join(out, "runtime.json"))
    ps = even if R in (0, 2) else lone
    got = gf.allreduce(x, op=gf.Average, name="late", process_set=ps)
    np.testing.assert_allclose(got, np.arange(6) * 2.0, rtol=1e-12)  # (x0 + x2) / 2 or x1
    got = gf.allreduce(x, op=gf.Sum, name="global.late")
    np.testing.assert_array_equal(got, np.arange(6) * 6.0)
    gf.stop_timeline()
    # A removed set's engine stops without closing the timeline it shares.
    gf.start_timeline(os.path.join(out, "after_remove.json"))
    assert gf.remove_process_set(even) and gf.remove_process_set(lone)
    np.testing.assert_array_equal(gf.allreduce(x, op=gf.Sum, name="after"), np.arange(6) * 6.0)
if sys.argv[1:2] == ["reinit"]:
    for name in ("second", "third"):
        gf.shutdown()
        gf.init()
        np.testing.assert_array_equal(gf.allreduce(np.ones(4), op=gf.Sum, name=name),
                                      np.full(4, float(gf.size())))
gf.shutdown()
