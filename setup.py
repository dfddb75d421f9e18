"""Build gradflow's one framework-agnostic extension, gradflow._native.

The native core (native/*.cc) is compiled once with the flags of an MPI C++
wrapper, found in this order: $GRADFLOW_MPICXX, the `mpicxx` beside the
running Python (the `mpich` wheel from PyPI, a build dependency), then
`mpicxx` on PATH. No torch or TensorFlow headers are used.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext, naive_recompile
from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_with_pth(build_py):
    """Also install gradflow-horovod-compat.pth at the top of site-packages:
    site.py runs it at every start-up, and it puts the horovod shim on
    sys.path only when GRADFLOW_HOROVOD_COMPAT is true (otherwise it does
    nothing), so other launchers (mpiexec, srun) get compatibility mode
    from the environment alone."""

    PTH = os.path.join("gradflow", "horovod_compat", "gradflow-horovod-compat.pth")

    def run(self):
        super().run()
        self.copy_file(self.PTH, os.path.join(self.build_lib, os.path.basename(self.PTH)))


def find_mpicxx() -> str:
    explicit = os.environ.get("GRADFLOW_MPICXX")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    if os.path.exists(beside):
        return beside
    found = shutil.which("mpicxx")
    if found:
        return found
    raise RuntimeError("gradflow: no MPI C++ wrapper found; `pip install mpich` or set GRADFLOW_MPICXX")


def mpi_flags(mpicxx: str):
    """Include dirs, library dirs and libraries from `mpicxx -show`."""
    out = subprocess.check_output([mpicxx, "-show"], text=True)
    inc, libdirs, libs = [], [], []
    for tok in shlex.split(out)[1:]:
        if tok.startswith("-I"):
            inc.append(tok[2:])
        elif tok.startswith("-L"):
            libdirs.append(tok[2:])
        elif tok.startswith("-l"):
            libs.append(tok[2:])
    return inc, libdirs, libs


# Compile native/*.cc in parallel (GRADFLOW_BUILD_JOBS, default: all cores).
# GRADFLOW_INCREMENTAL=1 (developer in-place builds) recompiles only sources
# newer than their object file; a changed header needs `touch` on its users
# or `rm -r build/`.
ParallelCompile("GRADFLOW_BUILD_JOBS", default=0,
                needs_recompile=naive_recompile if os.environ.get("GRADFLOW_INCREMENTAL") == "1"
                else (lambda obj, src: True)).install()

inc, libdirs, libs = mpi_flags(find_mpicxx())
sources = sorted(glob.glob("native/*.cc"))
debug = os.environ.get("GRADFLOW_DEBUG_BUILD") == "1"
sanitize = os.environ.get("GRADFLOW_SANITIZE", "")
extra_compile = ["-O1", "-g", "-fno-omit-frame-pointer"] if debug or sanitize else ["-O3"]
extra_link = []
if sanitize:
    extra_compile.append(f"-fsanitize={sanitize}")
    extra_link.append(f"-fsanitize={sanitize}")

ext = Pybind11Extension(
    "gradflow._native",
    sources,
    include_dirs=["native"] + inc,
    library_dirs=libdirs,
    libraries=libs,
    cxx_std=17,
    extra_compile_args=extra_compile + ["-Wall", "-Wno-sign-compare"],
    # libmpi from the mpich wheel lives in <venv>/lib; the extension sits in
    # <venv>/lib/python3.X/site-packages/gradflow. mpi4py (imported first by
    # gradflow/__init__.py) also loads it; this runpath is the fallback.
    extra_link_args=extra_link + ["-Wl,-rpath,$ORIGIN/../../.."],
)

setup(ext_modules=[ext], cmdclass={"build_ext": build_ext, "build_py": build_py_with_pth})
