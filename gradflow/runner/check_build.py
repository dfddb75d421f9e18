"""gradflowrun --check-build: gradflow's version, which frameworks are
installed (found without importing them), the MPI library and the native
module's features(). Never fails because something is missing; fails (via
mpi_mismatch) when the extension and mpi4py were built against different MPIs,
which otherwise shows up later as a crash or a hang inside MPI_Init.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple


def check_build(native: Any, native_note: str) -> str:
    """The --check-build report: version, frameworks (found without importing
    them), MPI library and the native module's features()."""
    from importlib import util as iu
    lines = [f"gradflow {_version(native)}", "", "Available frameworks:"]
    for label, module in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")):
        lines.append(f"    [{'X' if iu.find_spec(module) else ' '}] {label}")
    lines += ["", "MPI:", f"    mpi4py: {_mpi_version()}"]
    if native is not None and getattr(native, "features", None) is not None:
        feats = dict(native.features())
        lines.append(f"    gradflow._native: {_first_words(feats.get('mpi', '?'))}")
        lines.append(f"    gradflow._native built with: {feats.get('mpi_built_with', '?')}")
    vendor = _mpi4py_vendor()
    if vendor:
        lines.append(f"    mpi4py built with: {vendor[0]} {vendor[1]}")
    lines += ["", "Native core:"]
    features = getattr(native, "features", None) if native is not None else None
    if native is None:
        lines.append(f"    not available: {native_note}")
    elif features is None:
        lines.append("    built (this build does not report features())")
    else:
        for name, value in sorted(dict(features()).items()):
            if isinstance(value, (list, tuple)):
                value = ", ".join(str(v) for v in value)
            lines.append(f"    {name}: " + str(value).strip().replace("\n", "\n        "))
    return "\n".join(lines)


def mpi_mismatch(native: Any) -> Optional[str]:
    """A message when gradflow._native and mpi4py were built against different
    MPI vendors or load different MPI libraries; None when they agree or when
    either side cannot tell (missing mpi4py or native module, older build)."""
    features = getattr(native, "features", None) if native is not None else None
    vendor = _mpi4py_vendor()
    if features is None or vendor is None:
        return None
    feats = dict(features())
    built = str(feats.get("mpi_built_with", ""))
    problems = []
    if built and not built.startswith(vendor[0] + " "):
        problems.append(f"gradflow._native was built with {built}, mpi4py with "
                        f"{vendor[0]} {vendor[1]}")
    lib = _mpi_library()
    if lib is not None and _words(feats.get("mpi", "")) != _words(lib):
        problems.append(f"gradflow._native runs {_first_words(feats.get('mpi', '?'))!r}, "
                        f"mpi4py runs {_first_words(lib)!r}")
    if not problems:
        return None
    return ("gradflow and mpi4py use different MPI libraries: " + "; ".join(problems) +
            ". Build both against the same MPI: GRADFLOW_MPICXX=<its mpicxx> for gradflow, "
            "MPICC=<its mpicc> pip install --no-binary mpi4py mpi4py (README: On a cluster).")


def _words(text: Any) -> str:
    # Open MPI counts a trailing NUL in MPI_Get_library_version's length,
    # which mpi4py keeps and the native side strips: compare the words only.
    return " ".join(str(text).replace("\x00", " ").split())


def _first_words(text: Any) -> str:
    return " ".join(str(text).split()[:12])


def _mpi4py_vendor() -> Optional[Tuple[str, str]]:
    """(vendor, "x.y.z") of the MPI mpi4py was compiled with, or None."""
    try:
        import mpi4py  # noqa: PLC0415
        mpi4py.rc.initialize = False
        from mpi4py import MPI  # noqa: PLC0415
        name, version = MPI.get_vendor()
        return str(name), ".".join(str(v) for v in version)
    except Exception:  # noqa: BLE001 - mpi4py missing or broken: reported elsewhere
        return None


def _mpi_library() -> Optional[str]:
    try:
        import mpi4py  # noqa: PLC0415
        mpi4py.rc.initialize = False
        from mpi4py import MPI  # noqa: PLC0415
        return str(MPI.Get_library_version())
    except Exception:  # noqa: BLE001
        return None


def _version(native: Any) -> str:
    try:
        from importlib import metadata  # noqa: PLC0415
        return metadata.version("gradflow")
    except Exception:  # noqa: BLE001 - not installed (source tree)
        return str(getattr(native, "__version__", "(version unknown: not installed)"))


def _mpi_version() -> str:
    try:
        import mpi4py  # noqa: PLC0415
        mpi4py.rc.initialize = False  # Get_library_version needs no MPI_Init
        from mpi4py import MPI  # noqa: PLC0415
        return _first_words(MPI.Get_library_version())
    except Exception as e:  # noqa: BLE001 - report, never fail the check
        return f"mpi4py not usable: {e}"
