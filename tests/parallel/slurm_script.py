"""Run under Slurm by test_slurm.py: prints what gradflow sees of its
placement next to Slurm's variables, checks allreduce/allgather/broadcast
against numpy (every rank's input is rebuilt from its seed), and prints a
digest of the results so the test can compare ranks bit for bit."""
import hashlib
import os

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
inputs = [np.random.default_rng(100 + r).standard_normal(1000) for r in range(N)]
summed = gf.allreduce(inputs[R], op=gf.Sum, name="sum")
ref = inputs[0].copy()
for x in inputs[1:]:  # allclose below, not equal: the ring may add in another order
    ref += x
assert np.allclose(summed, ref, rtol=1e-12, atol=1e-12), (R, np.abs(summed - ref).max())
gathered = gf.allgather(np.full((R + 1, 2), R, np.int64), name="gather")
assert np.array_equal(gathered, np.concatenate([np.full((r + 1, 2), r) for r in range(N)]))
bcast = gf.broadcast(inputs[R], root_rank=N - 1, name="bcast")
assert np.array_equal(bcast, inputs[N - 1])
digest = hashlib.sha256(summed.tobytes() + gathered.tobytes() + bcast.tobytes()).hexdigest()
slurm = " ".join(f"{k}={os.environ.get(k)}" for k in ("SLURM_PROCID", "SLURM_NTASKS",
                                                        "SLURM_LOCALID"))
print(f"placement rank={R} size={N} local_rank={gf.local_rank()} "
      f"local_size={gf.local_size()} {slurm} sha {digest[:16]}", flush=True)
