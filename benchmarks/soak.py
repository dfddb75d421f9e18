#!/usr/bin/env python
"""Long soak of the collectives (the CI version is tests/parallel/test_soak.py):
N ranks run --ops mixed collectives (allreduce of random sizes, dtypes, ops
and wire formats, ragged allgather, broadcast, alltoall) checked against
numpy, with RSS sampled after warm-up and at the end.

    python benchmarks/soak.py                       # 4 ranks, 20,000 ops
    python benchmarks/soak.py -np 3 --ops 50000 --seed 7 --rss-bound-mb 32

Runs tests/parallel/soak_script.py under mpiexec with a timeout and prints
its summary line (ops/s, RSS samples, growth per rank). Exit code is the
job's. Each run writes benchmarks/results/soak-np<N>-ops<ops>-seed<seed>.json
(summary lines, exit code, load) and .log (the whole output); docs/robustness.md
quotes those files.
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
sys.path.insert(0, HERE)
import _benchutil as bu  # noqa: E402
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
    print("$ " + bu.portable_cmd(cmd), flush=True)
    t0 = time.monotonic()
    lines = []
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # echoed as it comes and kept for the log file
            print(line, end="", flush=True)
            lines.append(line)
        rc = proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = 124
        lines.append(f"soak: HUNG or too slow: no result after {args.timeout:.0f} s\n")
        print(lines[-1], end="", flush=True)
    elapsed = time.monotonic() - t0
    print(f"soak: exit code {rc} after {elapsed:.0f} s", flush=True)
    summary = [l.strip() for l in lines if l.startswith("soak ")]
    bu.record_result(f"soak-np{args.np}-ops{args.ops}-seed{args.seed}",
                     {"ranks": args.np, "ops": args.ops, "seed": args.seed, "exit_code": rc,
                      "seconds": round(elapsed, 1), "summary": summary}, "".join(lines))
    return rc


if __name__ == "__main__":
    sys.exit(main())
