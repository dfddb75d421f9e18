"""A few named allreduces, checked against numpy, for test_core_logging.py
(which reads the core's stderr log at the level gradflowrun --log-level set)."""
import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
for step in range(3):
    x = np.arange(10, dtype=np.float32) * (R + 1) + step
    got = gf.allreduce(x, name=f"logged.{step}", op=gf.Sum)
    want = sum(np.arange(10, dtype=np.float32) * (r + 1) + step for r in range(N))
    assert np.array_equal(got, want), (got, want)
print(f"rank {R} log level OK", flush=True)
gf.shutdown()
