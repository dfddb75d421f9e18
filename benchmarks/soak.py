#!/usr/bin/env python
"""Long soak of the collectives (the CI version is tests/parallel/test_soak.py):
N ranks run --ops mixed collectives (allreduce of random sizes, dtypes, ops
and wire formats, ragged allgather, broadcast, alltoall) checked against
numpy, with RSS sampled after warm-up and at the end.

    python benchmarks/soak.py                       # 4 ranks, 20,000 ops
    python benchmarks/soak.py -np 3 --ops 50000 --seed 7 --rss-bound-mb 32

Runs tests/parallel/soak_script.py under mpiexec with a timeout and prints
its summary line (ops/s, RSS samples, growth per rank). Exit code is the
job's. Results measured on the development machine are in docs/robustness.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "parallel"))
from _launch import in_place_build, mpiexec  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-np", type=int, default=4)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rss-bound-mb", type=float, default=32.0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole job")
    args = p.parse_args()
    env = dict(os.environ)
    env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    env.setdefault("OMP_NUM_THREADS", "1")
    if in_place_build():
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [mpiexec(), "-n", str(args.np), sys.executable,
           os.path.join(ROOT, "tests", "parallel", "soak_script.py"), "--ops", str(args.ops),
           "--seed", str(args.seed), "--rss-bound-mb", str(args.rss_bound_mb)]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, env=env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"soak: HUNG or too slow: no result after {args.timeout:.0f} s", flush=True)
        return 124
    print(f"soak: exit code {rc} after {time.monotonic() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
