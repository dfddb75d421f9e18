#!/usr/bin/env python
"""A long property-based run (the CI version is tests/parallel/test_properties.py):
tests/parallel/property_script.py at each rank count with many hypothesis
examples, under mpiexec with a timeout. Writes benchmarks/results/property.json
(per rank count: exit code, batches, what they covered, seconds) and
property.log (whole output); docs/robustness.md quotes those files.

    python benchmarks/property_run.py                        # 150 batches at 1, 2, 3, 4 ranks
    python benchmarks/property_run.py --ranks 2 3 --examples 500 --seed 7
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _benchutil as bu  # noqa: E402

SCRIPT = os.path.join(bu.ROOT, "tests", "parallel", "property_script.py")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--examples", type=int, default=150)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per rank count")
    a = p.parse_args()
    runs, log, worst = [], [], 0
    for n in a.ranks:
        cmd = bu.launcher_prefix(n) + [sys.executable, SCRIPT, "--examples",
                                                   str(a.examples), "--seed", str(a.seed + n)]
        print("$ " + bu.portable_cmd(cmd), flush=True)
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, env=bu.base_env(n), capture_output=True,
                                 text=True, timeout=a.timeout)
            rc, text = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = 124, f"{e.stdout or ''}{e.stderr or ''}\nTIMED OUT after {a.timeout:.0f} s\n"
        ok_lines = [l.strip() for l in text.splitlines() if l.startswith("property OK")]
        runs.append({"ranks": n, "exit_code": rc, "seconds": round(time.monotonic() - t0, 1),
                     "summary": ok_lines})
        print(f"  exit {rc}: {ok_lines[0] if ok_lines else text[-2000:]}", flush=True)
        log.append(f"$ {bu.portable_cmd(cmd)}\n{text}\n")
        worst = worst or rc
    bu.record_result("property", {"examples": a.examples, "seed": a.seed, "runs": runs}, "".join(log))
    return worst


if __name__ == "__main__":
    sys.exit(main())
