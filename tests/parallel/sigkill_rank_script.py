"""One rank (argv[1], default 1) kills itself with SIGKILL while a stream of
64 MiB allreduces is on the wire; every other rank must raise GradflowError
within 30 s (run with GRADFLOW_TIMEOUT=10). Prints "rank R raised after T s"."""
import os
import signal
import sys
import threading
import time

import numpy as np

import gradflow as gf

VICTIM = int(sys.argv[1]) if len(sys.argv) > 1 else 1
BIG = 16 << 20  # float32 elements: 64 MiB

gf.init()
R = gf.rank()
x = np.ones(BIG, np.float32)
gf.allreduce(x, op=gf.Sum, name="warmup")  # everyone is up and the big path is warm
gf.barrier()

if R == VICTIM:
    def kill_soon():
        time.sleep(0.3)  # a 64 MiB allreduce takes longer than the gap between them
        print(f"rank {R}: SIGKILL now", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=kill_soon, daemon=True).start()

t0 = time.time()
i = 0
try:
    while time.time() - t0 < 120:  # the victim never finishes this loop
        h = gf.allreduce_async(x, op=gf.Sum, name=f"big.{i}")
        h.wait()
        i += 1
except gf.GradflowError as e:
    took = time.time() - t0
    print(f"rank {R} raised after {took:.1f} s in allreduce big.{i}: {e}", flush=True)
    assert took < 30, f"rank {R} took {took:.1f} s to notice the dead rank"
    sys.exit(7)
print(f"rank {R}: no error after {i} allreduces", flush=True)
