"""Per-call cost of gradflow's Python binding on ONE rank (issue 16, target 6:
the per-call path of small collectives). On one rank nothing is exchanged,
so a synchronous 4 KiB allreduce is the binding (argument checks, naming,
submit, handle) plus the two thread hand-offs of the core.

    PYTHONPATH=. python benchmarks/python_call_overhead.py [--api numpy|torch]

Prints the per-call time of `--blocks` blocks of `--calls` calls each, sorted
(the minimum is the least disturbed by other load on the machine). Run it
alternately on two checkouts to compare them; a single run says little on
a shared machine. No MPI launcher needed (a one-rank world)."""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", choices=("numpy", "torch"), default="numpy")
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--blocks", type=int, default=5)
    a = p.parse_args()
    if a.api == "torch":
        import torch
        import gradflow.torch as hvd

        hvd.init()
        x = torch.ones(a.bytes // 4)
        call = lambda: hvd.allreduce_(x, name="x")  # noqa: E731
    else:
        import gradflow as gf

        gf.init()
        x = np.ones(a.bytes // 4, np.float32)
        call = lambda: gf.allreduce(x, name="x")  # noqa: E731
    for _ in range(200):  # warm-up: first-call costs, caches
        call()
    per_call = []
    for _ in range(a.blocks):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            call()
        per_call.append((time.perf_counter() - t0) / a.calls * 1e6)
    print(f"{a.api} {a.bytes} B, one rank: µs per call, blocks sorted: "
          + " ".join(f"{v:.1f}" for v in sorted(per_call)), flush=True)


if __name__ == "__main__":
    main()
