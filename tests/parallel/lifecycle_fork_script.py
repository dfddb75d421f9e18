"""fork() after init(): the child's first gradflow call raises a clear
GradflowError (it used to hang: the child has no background thread), its
init() raises too; a child that exits normally (gradflow skips
MPI_Finalize there, which would tear down the parent's MPI state) leaves the
parent's job working."""
import os
import sys
import time

import numpy as np

import gradflow as gf

gf.init()
R, N = gf.rank(), gf.size()
gf.allreduce(np.ones(3), name="before.fork")


def child_checks():
    status = 0
    for call in (lambda: gf.allreduce(np.ones(3), name="in.child"), gf.rank,
                 lambda: gf.allreduce_async(np.ones(3), name="in.child.async"), gf.init):
        try:
            call()
            status = 10
        except gf.GradflowError as e:
            if "fork" not in str(e):
                status = 11
    if gf.is_initialized():
        status = 12
    return status


def wait_child(pid):
    deadline = time.monotonic() + 30
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(st)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise AssertionError(f"rank {R}: the fork() child hangs")
        time.sleep(0.05)


pid = os.fork()
if pid == 0:  # reports through its exit status (os._exit: sys.exit's code is lost)
    os._exit(child_checks())
code = wait_child(pid)
# 10: a call did not raise; 11: the error does not say fork; 12: is_initialized()
assert code == 0, f"rank {R}: fork() child exited with {code}"

pid = os.fork()
if pid == 0:  # the first call raises; then a normal exit, at-exit handlers and all
    try:
        gf.allreduce(np.ones(3), name="in.child.2")
    except gf.GradflowError:
        pass
    sys.exit(0)
assert wait_child(pid) == 0
got = gf.allreduce(np.full(5, R + 1.0), op=gf.Sum, name="after.fork")
np.testing.assert_array_equal(got, np.full(5, N * (N + 1) / 2))
gf.barrier()
if R == 0:
    print(f"fork OK on {N} ranks", flush=True)
