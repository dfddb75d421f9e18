#!/usr/bin/env python3
"""Run Horovod's own torch test suite (test/parallel/test_torch.py) against
gradflow through compatibility mode, one test per job, and print a table.

Horovod's code is never part of this repository: fetch the test file (and the
three helpers it imports from test/utils/common.py, as common.py beside it)
yourself and pass its path:

    python scripts/horovod_torch_suite.py /tmp/hvd_suite/test_torch.py --np 2 3

Each test runs as `gradflowrun --horovod-compat -np N python -m pytest
FILE::TorchTests::NAME` with a timeout, so one hang or crash costs one test.
A test passes when every rank passes, is skipped when every rank skips (the
reason is Horovod's own skip message), and fails otherwise (the first failing
line of the output is shown). Exit status: 0 when nothing failed.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Tuple


def test_names(path: str) -> Tuple[List[str], List[str]]:
    """Test methods of the TestCase classes, in file order; a name defined
    twice is listed once (Python keeps the last definition) and reported."""
    tree = ast.parse(open(path).read(), path)
    names, dups = [], []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                key = f"{cls.name}::{fn.name}"
                if key in names:
                    dups.append(key)
                else:
                    names.append(key)
    return names, dups


def launcher() -> List[str]:
    """gradflowrun beside this Python, else the module (a source checkout)."""
    exe = os.path.join(os.path.dirname(sys.executable), "gradflowrun")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "gradflow.runner.launch"]


def run_one(path: str, test: str, n: int, timeout: float) -> Tuple[str, str, float]:
    cmd = launcher() + ["--horovod-compat", "-np", str(n), sys.executable, "-m", "pytest",
                        "-q", "-rs", "-p", "no:cacheprovider", f"{path}::{test}"]
    t0 = time.time()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=os.path.dirname(os.path.abspath(path)))
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout:.0f} s", time.time() - t0
    text = out.stdout + out.stderr
    passed = len(re.findall(r"\b1 passed\b", text))
    skipped = len(re.findall(r"\b1 skipped\b", text))
    if passed == n and out.returncode == 0:
        return "pass", "", time.time() - t0
    if skipped == n and out.returncode == 0:
        m = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)
        return "skip", m.group(1).strip() if m else "skipped", time.time() - t0
    lines = [ln for ln in text.splitlines()
             if re.match(r"^E\s+\S", ln) or "Error" in ln or "FAILED" in ln]
    return "fail", (lines[0].strip() if lines else text.strip()[-300:]), time.time() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("test_file", help="path of Horovod's test/parallel/test_torch.py")
    p.add_argument("--np", type=int, nargs="+", default=[2], help="rank counts (default 2)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per test job")
    p.add_argument("-k", default="", help="only tests whose name contains this")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    path = os.path.abspath(a.test_file)
    names, dups = test_names(path)
    names = [t for t in names if a.k in t]
    results: Dict[str, Dict[int, Tuple[str, str, float]]] = {}
    for t in names:
        results[t] = {}
        for n in a.np:
            results[t][n] = run_one(path, t, n, a.timeout)
            st, why, secs = results[t][n]
            print(f"{t.split('::')[-1]:48s} np={n} {st:7s} {secs:6.1f}s {why}", flush=True)
    print("\n| test | " + " | ".join(f"np={n}" for n in a.np) + " | reason |")
    print("|---|" + "---|" * len(a.np) + "---|")
    for t in names:
        why = "; ".join(sorted({r[1] for r in results[t].values() if r[1]}))
        print(f"| {t.split('::')[-1]} | " + " | ".join(results[t][n][0] for n in a.np) +
              f" | {why} |")
    for n in a.np:
        counts: Dict[str, int] = {}
        for t in names:
            counts[results[t][n][0]] = counts.get(results[t][n][0], 0) + 1
        print(f"np={n}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for d in dups:
        print(f"note: {d} is defined twice in the file; only the last definition runs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({t: {str(n): list(r) for n, r in v.items()} for t, v in results.items()},
                      f, indent=1)
    return 1 if any(r[0] in ("fail", "timeout") for v in results.values()
                    for r in v.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
