"""A few named allreduces, checked against numpy, for test_core_logging.py
(which reads the core's stderr log at the level gradflowrun --log-level set);
from 3 ranks also one in a process set of ranks 1.. (its engine's lines)."""
import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
for step in range(3):
    x = np.arange(10, dtype=np.float32) * (R + 1) + step
    got = gf.allreduce(x, name=f"logged.{step}", op=gf.Sum)
    want = sum(np.arange(10, dtype=np.float32) * (r + 1) + step for r in range(N))
    assert np.array_equal(got, want), (got, want)
if N >= 3:
    # A process set's engine counts its members from 0; its log lines must
    # still carry this process's global rank (test_trace_logs_each_response).
    ps = gf.add_process_set(list(range(1, N)))
    if R >= 1:
        got = gf.allreduce(np.full(4, R, np.float32), name="in.set.logged", op=gf.Sum,
                           process_set=ps)
        assert np.array_equal(got, np.full(4, sum(range(1, N)), np.float32)), got
    gf.remove_process_set(ps)
print(f"rank {R} log level OK", flush=True)
gf.shutdown()
