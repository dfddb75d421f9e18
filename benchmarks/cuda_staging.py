#!/usr/bin/env python
"""What staging CUDA tensors through host memory costs: an in-place Sum
allreduce of a float32 tensor, run under the MPI launcher on one machine
with a GPU (the ranks may share it):

    mpiexec -n 2 python benchmarks/cuda_staging.py [--sizes 1MiB,16MiB,64MiB] [--iters 20]

Systems, interleaved per iteration (so drift hits all alike), medians of the
slowest rank's time, barrier before each:
  gradflow-cuda  gradflow.torch.allreduce_ of a CUDA tensor (device -> host
                 copy, the core's allreduce over shared memory, host -> device)
  gradflow-cuda-pinned  the alternative, by hand: a pinned host buffer
                 (torch's caching host allocator), copy in, allreduce_ of
                 it, copy back. Measured slower from 16 MiB up on an H100
                 (docs/gpu.md), so gradflow stages to pageable memory.
  gradflow-cpu   the same on a CPU tensor (no staging): the staging cost is
                 the difference
  gloo-cuda      torch.distributed.all_reduce of the CUDA tensor on a gloo
                 group (gloo stages CUDA tensors through host memory too)
Every result is checked against the exact sum (integer-valued data).
Prints one markdown table (rank 0). Not part of the test suite: no GPU in CI.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

import gradflow.torch as hvd
from _benchutil import fmt_size, parse_size  # run as a script: benchmarks/ is on sys.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1MiB,16MiB,64MiB,256MiB")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    port = hvd.broadcast_object(_free_port() if r == 0 else None, 0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=n)

    def run(system: str, buf: torch.Tensor) -> float:
        hvd.barrier()
        if buf.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if system == "gloo-cuda":
            dist.all_reduce(buf)
        elif system == "gradflow-cuda-pinned":
            host = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
            host.copy_(buf)
            hvd.allreduce_(host, op=hvd.Sum, name=f"bench.{system}.{buf.numel()}")
            buf.copy_(host)
        else:
            hvd.allreduce_(buf, op=hvd.Sum, name=f"bench.{system}.{buf.numel()}")
        if buf.is_cuda:
            torch.cuda.synchronize()
        mine = time.perf_counter() - t0
        return max(hvd.allgather_object(mine))  # the slowest rank's time

    rows = []
    systems = ("gradflow-cuda", "gradflow-cuda-pinned", "gradflow-cpu", "gloo-cuda")
    for size in (parse_size(s) for s in args.sizes.split(",")):
        count = size // 4
        base = (torch.arange(count) % 7).float()
        want = base * n + n * (n - 1) / 2
        times = {s: [] for s in systems}
        for it in range(args.iters + 2):  # two warm-ups
            for s in systems:
                buf = (base + r).to(dev if s.endswith("cuda") else "cpu")
                t = run(s, buf)
                assert torch.equal(buf.cpu(), want), s
                if it >= 2:
                    times[s].append(t)
        med = {s: statistics.median(v) for s, v in times.items()}
        rows.append((size, med))
    if r == 0:
        print(f"ranks {n}, GPU {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
              f"{args.iters} iterations (medians of the slowest rank)")
        print("| size | gradflow-cuda ms | gradflow-cuda-pinned ms | gradflow-cpu ms | gloo-cuda ms"
              " | pinned / cuda | cuda / cpu | gloo / gradflow-cuda |")
        print("|---|---|---|---|---|---|---|---|")
        for size, med in rows:
            g, pn = med["gradflow-cuda"], med["gradflow-cuda-pinned"]
            c, gl = med["gradflow-cpu"], med["gloo-cuda"]
            print(f"| {fmt_size(size)} | {g * 1e3:.2f} | {pn * 1e3:.2f} | {c * 1e3:.2f} | "
                  f"{gl * 1e3:.2f} | {pn / g:.2f} | {g / c:.2f} | {gl / g:.2f} |")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
