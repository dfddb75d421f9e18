"""gradflowrun --check-build: gradflow's version, which frameworks are
installed (found without importing them), the MPI library and the native
module's features(). Reports only; never fails because something is missing.
"""

from __future__ import annotations

from typing import Any


def check_build(native: Any, native_note: str) -> str:
    """The --check-build report: version, frameworks (found without importing
    them), MPI library and the native module's features()."""
    from importlib import util as iu
    lines = [f"gradflow {_version(native)}", "", "Available frameworks:"]
    for label, module in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")):
        lines.append(f"    [{'X' if iu.find_spec(module) else ' '}] {label}")
    lines += ["", "MPI:", f"    {_mpi_version()}", "", "Native core:"]
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
        return " ".join(MPI.Get_library_version().split()[:12])
    except Exception as e:  # noqa: BLE001 - report, never fail the check
        return f"mpi4py not usable: {e}"
