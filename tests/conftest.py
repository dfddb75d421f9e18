"""Test setup: tests import the installed gradflow; a source tree with an
in-place build (`python setup.py build_ext --inplace`) is used instead when present."""
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(ROOT, "gradflow", "_native*.so")) and not os.environ.get("GRADFLOW_TEST_INSTALLED"):
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "parallel"))


# GRADFLOW_TEST_CPU_LOG=<file>: one line per test, "<wall s> <cpu s> <nodeid>",
# the CPU of the processes the test started and waited for (its ranks)
# included. For planning CI stages: a test that waits (timeouts, sleeps)
# has cpu << wall and can run beside others; one that computes cannot.
_CPU_LOG = os.environ.get("GRADFLOW_TEST_CPU_LOG")
if _CPU_LOG:
    import resource
    import time

    import pytest

    def _cpu_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        wall, cpu = time.monotonic(), _cpu_seconds()
        yield
        with open(_CPU_LOG, "a", encoding="utf-8") as f:
            f.write(f"{time.monotonic() - wall:.2f} {_cpu_seconds() - cpu:.2f} {item.nodeid}\n")
