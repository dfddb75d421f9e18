"""No development-machine paths in the repository (issue 17.7): every tracked
text file is searched for absolute paths under the folders the project was
developed and checked in (the work and check trees, home folders). Generic
system paths (/tmp, /usr, /proc, /etc, /opt/... in test fixtures) are fine.
Benchmark results record repository-relative paths
(benchmarks/_benchutil.portable_path); docs/performance.md says how the older
result files were normalized."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Built from pieces so this file does not match itself.
MACHINE_DIRS = ("wo" + "rk", "che" + "ck", "ho" + "me", "ro" + "ot")
PATTERN = re.compile(r"(?<![\w.~$-])/(?:" + "|".join(MACHINE_DIRS) + r")/[\w.-]")


def tracked_files():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (e.g. an sdist): nothing tracked to search")
    return [p for p in out.decode().split("\0") if p]


def test_pattern_catches_machine_paths_and_spares_generic_ones():
    bad = ["PY=/" + "work/venv/bin/python", '"cwd": "/' + "check/main/docs\"",
           "cd /" + "home/dev/gradflow", "/" + "root/.cache/x"]
    good = ["/tmp/life-orig", "/usr/bin/mpicc", "/proc/self/status", "/etc/hosts",
            "/opt/mpi/mpiexec", "benchmarks/results/x.json", "https://example.org/" + "work/x",
            "network/" + "work/x", "~/" + "work/x"]
    assert all(PATTERN.search(s) for s in bad), [s for s in bad if not PATTERN.search(s)]
    assert not any(PATTERN.search(s) for s in good), [s for s in good if PATTERN.search(s)]


def test_no_machine_paths_in_tracked_files():
    found = []
    for rel in tracked_files():
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:  # binary (images)
            continue
        for no, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            m = PATTERN.search(line)
            if m:
                found.append(f"{rel}:{no}: {line.strip()[:160]}")
    assert not found, "development-machine paths in tracked files:\n" + "\n".join(found[:50])


def test_benchmarks_record_repository_relative_paths():
    """What the benchmark drivers write into results: paths in (or beside)
    the project relative to its root, generic system paths kept."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(
        "_benchutil_under_test", os.path.join(ROOT, "benchmarks", "_benchutil.py"))
    bu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bu)
    # Another tree outside the generic system folders (the checkout itself
    # may live under /tmp, whose paths are kept as they are).
    other_tree = "/gradflow-test-trees/old-tree"
    other_rel = os.path.relpath(other_tree, ROOT)
    assert other_rel.startswith("..")
    assert bu.portable_path(ROOT) == "."
    assert bu.portable_path(os.path.join(ROOT, "docs")) == "docs"
    assert bu.portable_path(other_tree) == other_rel
    assert bu.portable_path("/tmp/life-orig") == "/tmp/life-orig"
    assert bu.portable_path(7) == 7 and bu.portable_path("rel/x") == "rel/x"
    line = bu.portable_cmd([sys.executable, os.path.join(ROOT, "benchmarks", "csc_cpu_cost.py"),
                            "--trees", "/tmp/a", other_tree, ROOT])
    assert line == f"python benchmarks/csc_cpu_cost.py --trees /tmp/a {other_rel} .", line
    assert not PATTERN.search(line)
