# torch_alltoall_args_script.py — SPMD: alltoall's argument errors are
# Horovod's (found by Horovod's own torch suite): ValueError at submit on the
# rank that made them, for a first dimension that does not divide evenly
# without splits, splits summing past the first dimension and non-integer
# splits; the runtime keeps working afterwards (checked against numpy).
import numpy as np
import torch

import gradflow as gf
import gradflow.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()


def raises_value_error(fn, needle):
    try:
        fn()
    except ValueError as e:
        assert needle in str(e), f"message lacks {needle!r}: {e}"
        return
    raise AssertionError(f"expected ValueError containing {needle!r}")


def ok(name):
    if R == 0:
        print(f"ok {name} (size {N})", flush=True)


raises_value_error(lambda: hvd.alltoall(torch.zeros(N + 1)), "not a multiple")
raises_value_error(lambda: gf.alltoall(np.zeros(N + 1)), "not a multiple")
raises_value_error(lambda: hvd.alltoall(torch.zeros(N - 1), torch.ones(N, dtype=torch.int32)),
                   "more than the first dimension")
raises_value_error(lambda: hvd.alltoall(torch.zeros(N), torch.ones(N, dtype=torch.float32)),
                   "must hold integers")
ok("alltoall argument errors raise ValueError")

# Still working: an even default split and rank-dependent explicit splits.
send = torch.arange(2 * N, dtype=torch.float64) + 100 * R
got = hvd.alltoall(send)
want = np.concatenate([np.arange(2 * R, 2 * R + 2) + 100 * p for p in range(N)])
np.testing.assert_array_equal(got.numpy(), want)
splits = torch.tensor([p + 1 for p in range(N)], dtype=torch.int32)  # p+1 rows to rank p
send = torch.full((int(splits.sum()),), float(R))
got, received = hvd.alltoall(send, splits)
assert received.tolist() == [R + 1] * N, received
np.testing.assert_array_equal(got.numpy(), np.repeat(np.arange(N, dtype=np.float32), R + 1))
ok("alltoall after refused calls matches numpy")
