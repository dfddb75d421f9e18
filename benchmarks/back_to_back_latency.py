"""Per-call latency of back-to-back synchronous small allreduces (issue 16,
target 6): `gradflow.torch.allreduce_` of a float32 tensor called again as
soon as the previous call returns, no barrier in between: what a training
loop's metric or scalar allreduces see. (allreduce_bench.py puts a barrier
before every call, so there each call starts with the ranks in step and
the loops idle; --barrier does the same here.)

    mpiexec -n 2 python benchmarks/back_to_back_latency.py            # 4 KiB, 3 blocks of 2000 calls
    mpiexec -n 1 python benchmarks/back_to_back_latency.py --bytes 65536
    mpiexec -n 2 python benchmarks/back_to_back_latency.py --bytes 1048576 --api numpy
    mpiexec -n 2 python benchmarks/back_to_back_latency.py --bytes 1048576 --api mpi   # the reference
    mpiexec -n 2 python benchmarks/back_to_back_latency.py --barrier   # ranks in step before each call
    mpiexec -n 4 python benchmarks/back_to_back_latency.py --bytes 1048576 --api numpy --paired

--paired alternates, in the same processes, a block of the gradflow call
with a block of mpi4py's `Allreduce` of the same size (the order swapped
every round), and prints per round the ratio of the two block medians (the
slowest rank's median for each). With 4 ranks on 2 cores every process
group lands in its own scheduling state, which moves each system's time by
2-3x between launches; within one group both systems share that state, so
the per-round ratio is a paired comparison.

--api mpi measures mpi4py's `Allreduce` (MPI_Allreduce, out of place, into
a preallocated array) the same way, with no gradflow at all: the baseline
the issue's target compares with, from the same command.

Prints which gradflow it imported, then per rank and block the median call
time in µs, then the core's negotiation and transfer seconds per call
(gradflow.stats(), all blocks). The value is checked once against the exact
sum. In a source checkout built in place, run it with PYTHONPATH=. : Python
puts this script's folder, not the repository, first on sys.path, so it
would otherwise import an installed gradflow (a `pip install .` of an older
commit) and measure that."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

import gradflow
import gradflow.torch as hvd


def timed_blocks(call, a, rank: int, size: int) -> None:
    """`a.blocks` blocks of `a.calls` back-to-back calls; prints each block's
    median call time. With --barrier an mpi4py barrier (untimed) precedes
    every call, as in allreduce_bench.py."""
    barrier = None
    if a.barrier:
        from mpi4py import MPI
        barrier = MPI.COMM_WORLD.Barrier
    for _ in range(a.blocks):
        times = []
        for _ in range(a.calls):
            if barrier is not None:
                barrier()
            t0 = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - t0)
        print(f"rank {rank}: median {statistics.median(times) / 1e3:.1f} us per call "
              f"({a.api}, {a.bytes} B, {size} rank(s))", flush=True)


def mpi_reference(a) -> None:
    """The same measurement for MPI_Allreduce (mpi4py), out of place."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = np.ones(a.bytes // 4, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    assert np.array_equal(y, np.full_like(y, float(comm.size))), "wrong sum"
    timed_blocks(lambda: comm.Allreduce(x, y), a, comm.rank, comm.size)


def paired_rounds(call, a) -> None:
    """Alternate blocks of `call` (gradflow) and MPI_Allreduce in this
    process group; per round the ratio MPI time / gradflow time (> 1: gradflow
    faster), each system's time the slowest rank's block median."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = np.ones(a.bytes // 4, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y)
    assert np.array_equal(y, np.full_like(y, float(comm.size))), "wrong sum"

    def block_median(fn) -> float:
        times = []
        for _ in range(a.calls):
            if a.barrier:
                comm.Barrier()
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        return comm.allreduce(statistics.median(times) / 1e3, op=MPI.MAX)

    ratios = []
    for r in range(a.blocks):
        order = ("gradflow", "mpi") if r % 2 == 0 else ("mpi", "gradflow")
        us = {}
        for system in order:
            us[system] = block_median(call if system == "gradflow" else lambda: comm.Allreduce(x, y))
        ratios.append(us["mpi"] / us["gradflow"])
        if comm.rank == 0:
            print(f"round {r}: gradflow {us['gradflow']:.1f} us, MPI_Allreduce {us['mpi']:.1f} us, "
                  f"gradflow speed / MPI's {ratios[-1]:.2f} ({a.api}, {a.bytes} B, {comm.size} ranks, "
                  f"first {order[0]})", flush=True)
    if comm.rank == 0:
        print(f"paired: median ratio {statistics.median(ratios):.2f} over {len(ratios)} rounds "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000, help="calls per block")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--api", choices=("torch", "numpy", "mpi"), default="torch",
                   help="torch: allreduce_ in place; numpy: gradflow.allreduce, out of place "
                        "(a new result array per call, the input untouched); mpi: mpi4py "
                        "Allreduce (MPI_Allreduce) out of place, no gradflow")
    p.add_argument("--paired", action="store_true",
                   help="alternate blocks of the gradflow call and of MPI_Allreduce in the same "
                        "processes (--blocks rounds) and print each round's ratio")
    p.add_argument("--barrier", action="store_true",
                   help="an MPI barrier (untimed) before every call: each call then starts "
                        "with the ranks in step, as in allreduce_bench.py")
    a = p.parse_args()
    if a.api == "mpi":
        mpi_reference(a)
        return
    hvd.init()
    if hvd.rank() == 0:
        print(f"gradflow {gradflow.__version__} from {os.path.dirname(gradflow.__file__)}", flush=True)
    t = torch.ones(a.bytes // 4)
    x = np.ones(a.bytes // 4, np.float32)
    if a.api == "torch":
        def call():
            hvd.allreduce_(t, op=hvd.Sum, name="b2b")
    else:
        def call():
            return gradflow.allreduce(x, op=gradflow.Sum, name="b2b")
    out = call()
    got = t.numpy() if a.api == "torch" else out
    assert np.array_equal(got, np.full_like(got, float(hvd.size()))), "wrong sum"
    gradflow.reset_stats()
    if a.paired:
        paired_rounds(call, a)
        hvd.shutdown()
        return
    timed_blocks(call, a, hvd.rank(), hvd.size())
    st = gradflow.stats()
    n = a.calls * a.blocks
    print(f"rank {hvd.rank()}: per call negotiation {st.get('seconds_negotiation', 0) / n * 1e6:.1f} us, "
          f"transfer {st.get('seconds_transfer', 0) / n * 1e6:.1f} us, "
          f"cycles {st.get('negotiation.cycles', 0) / n:.2f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
