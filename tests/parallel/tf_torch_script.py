# tests/parallel/tf_torch_script.py — SPMD script (run by test_tensorflow.py):
# gradflow.torch and gradflow.tensorflow in one process share one runtime and
# one background thread; collectives from both frameworks go through it.
import os

from _tf_common import tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
import gradflow  # noqa: E402
import gradflow.tensorflow as gtf  # noqa: E402
import gradflow.torch as gth  # noqa: E402


def os_threads():
    return len(os.listdir("/proc/self/task"))


assert not gradflow.is_initialized()
# init() starts MPI (import gradflow does not); MPI's own threads are not
# gradflow's: start MPI first so only gradflow's background thread is counted.
from mpi4py import MPI  # noqa: E402,F401
before = os_threads()
gth.init()
after_torch = os_threads()
gtf.init()  # a no-op: the runtime already exists
assert os_threads() == after_torch, (before, after_torch, os_threads())
assert after_torch - before <= 1, f"init started {after_torch - before} threads"
assert gradflow.is_initialized() and gtf.is_initialized() and gth.is_initialized()
R, N = gtf.rank(), gtf.size()
assert (R, N) == (gth.rank(), gth.size()) == (gradflow.rank(), gradflow.size())

gradflow.reset_stats()
t = gth.allreduce(torch.full((4,), float(R)), op=gth.Sum, name="from.torch")
x = gtf.allreduce(tf.fill([4], float(R)), op=gtf.Sum, name="from.tf")
want = sum(range(N))
assert np.allclose(t.numpy(), want) and np.allclose(x.numpy(), want), (t, x)
assert gradflow.stats()["allreduce.count"] == 2, gradflow.stats()  # one runtime counted both
gtf.shutdown()
assert not gth.is_initialized()
print(f"rank {R}: torch+tf one runtime OK", flush=True)
