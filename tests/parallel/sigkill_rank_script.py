"""One rank (argv[1], default 1) kills itself with SIGKILL; every other rank
must raise GradflowError. argv[2] says when: "mid" while a stream of 64 MiB
allreduces is on the wire (MPI itself may notice), "inside" a quarter of the
way through one 64 MiB allreduce (its duration measured on three before
it), so the death lands inside the algorithm's own exchanges rather than
between two collectives (measured: 23 of 24 runs; a busy machine may delay
the victim's wake-up past the collective), "idle" while the others wait for it in negotiation (only
GRADFLOW_TIMEOUT or gradflowrun's failure notice ends that wait), "busy"
while the others compute outside gradflow (gradflowrun's grace period stops
them), "alloc" (two-sync: the victim's loop thread dies inside the creation
of the second window, by the first allreduce on it, while the others are in
that MPI call without deadline: Note [Blocking MPI calls] in
native/mpi_comm.h; the library of $GRADFLOW_TEST_WINDOW_FAULT_LIB,
die_in_window_creation.c, stands in for MPI's window creation); "alloc-exit"
the same with _exit(3) in place of SIGKILL (plain mpiexec: hydra kills every
rank after a signal death, even with -disable-auto-cleanup). argv[3] is the
reduction, "sum" (default) or "adasum". Prints "rank V: SIGKILL at <epoch>"
and "rank R raised at <epoch> after T s ...": the test checks the times and
exit codes."""
import os
import signal
import sys
import threading
import time

import numpy as np

# Before gradflow loads MPI: RTLD_GLOBAL, so that the extension binds to this
# library's MPI_Win_allocate[_shared] (die_in_window_creation.c).
FAULT_LIB = os.environ.get("GRADFLOW_TEST_WINDOW_FAULT_LIB")
if FAULT_LIB:
    import ctypes
    FAULT = ctypes.CDLL(FAULT_LIB, mode=ctypes.RTLD_GLOBAL)

import gradflow as gf  # noqa: E402

VICTIM = int(sys.argv[1]) if len(sys.argv) > 1 else 1
MODE = sys.argv[2] if len(sys.argv) > 2 else "mid"
OP = {"sum": gf.Sum, "adasum": gf.Adasum}[sys.argv[3] if len(sys.argv) > 3 else "sum"]
BIG = 16 << 20  # float32 elements: 64 MiB

gf.init()
R = gf.rank()
EXIT_3 = MODE == "alloc-exit"
ALLOC = MODE in ("alloc", "alloc-exit")
if ALLOC and not FAULT_LIB:
    raise SystemExit("alloc modes need GRADFLOW_TEST_WINDOW_FAULT_LIB (tests/parallel/_window_fault.py)")
x = np.ones(BIG if MODE in ("mid", "inside") or ALLOC else 4, np.float32)
gf.allreduce(x, op=OP, name="warmup")  # everyone is up (and the big path is warm)
gf.barrier()


def die() -> None:
    if EXIT_3:
        print(f"rank {R}: exit 3 at {time.time():.3f}", flush=True)
        os._exit(3)
    print(f"rank {R}: SIGKILL at {time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if MODE == "busy" and R != VICTIM:  # computing, outside gradflow, when the victim dies
    time.sleep(120)
    print(f"rank {R}: still running after 120 s", flush=True)
    sys.exit(0)

if R == VICTIM:
    if MODE in ("idle", "busy"):
        time.sleep(0.5)  # the others are waiting in negotiation by now
        die()
    def kill_soon():
        time.sleep(0.3)  # a 64 MiB allreduce takes longer than the gap between them
        die()
    if MODE == "mid":
        threading.Thread(target=kill_soon, daemon=True).start()

# "inside": the victim submits last, when the others have long been waiting,
# so the collective starts at once and its duration from the victim's submit
# is the algorithm's own; it then dies a quarter of that after submitting
# (late enough for the negotiation to be over, early enough to be inside
# the exchanges although the sleep may overshoot on a busy machine).
quarter_allreduce = 0.0
if MODE == "inside":
    took = []
    for i in range(3):
        if R == VICTIM:
            time.sleep(0.2)
        t = time.time()
        gf.allreduce(x, op=OP, name=f"timed.{i}")
        took.append(time.time() - t)
    quarter_allreduce = sorted(took)[1] / 4

t0 = time.time()
i = 0
try:
    while time.time() - t0 < 300:  # the victim never finishes this loop
        if R == VICTIM and MODE == "inside":
            time.sleep(0.2)
        if R == VICTIM and ALLOC and i == 0:  # op.0: the second window's first use
            # Its loop thread dies 200 ms into that creation (the others
            # passed create_window's barrier with it and are inside).
            FAULT.gf_window_fault_arm(2 if EXIT_3 else 1, 200, R)
        h = gf.allreduce_async(x, op=OP, name=f"op.{i}")
        if R == VICTIM and MODE == "inside":
            time.sleep(quarter_allreduce)  # its loop thread is in the exchanges
            die()
        h.wait()
        i += 1
except gf.GradflowError as e:
    now = time.time()
    print(f"rank {R} raised at {now:.3f} after {now - t0:.1f} s in allreduce op.{i}: {e}",
          flush=True)
    sys.exit(7)
print(f"rank {R}: no error after {i} allreduces", flush=True)
