#!/usr/bin/env bash
# The GPU checks (docs/gpu.md): on a machine with a CUDA device and a Python
# that has a CUDA build of torch (plus pytest, pybind11 and setuptools),
# build gradflow in place against the mpich wheel and run
#   tests/parallel/test_torch_cuda.py   (CUDA tensors at 2 and 3 ranks)
#   benchmarks/cuda_staging.py          (what staging through host memory costs)
# CI has no GPU and does not run this. The mpich and mpi4py wheels come from
# PyPI, or from WHEELS=dir where the machine cannot reach it. Logs go to
# $LOGS (default: a new temporary folder), printed at the end. CC, CXX and
# LDSHARED choose the compiler as for any setuptools build (docs/gpu.md:
# the lent machine needed the system g++).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${LOGS:-$(mktemp -d)}
prefix=$(mktemp -d)
pyver=$("$PY" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --ignore-installed --prefix "$prefix" --no-index --no-deps --no-compile "$WHEELS"/mpich-*.whl \
    "$WHEELS"/mpi4py-*.whl
else
  "$PY" -m pip install -q --ignore-installed --prefix "$prefix" mpich "mpi4py>=4"
fi
export PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$PWD:$prefix/lib/$pyver/site-packages${PYTHONPATH:+:$PYTHONPATH}"
export GRADFLOW_MPICXX="$prefix/bin/mpicxx" MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0), "x", torch.cuda.device_count())'
"$PY" setup.py build_ext --inplace >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; exit 1; }
rc=0
"$PY" -m pytest -q -p no:cacheprovider -rs tests/parallel/test_torch_cuda.py 2>&1 |
  tee "$LOGS/pytest.log" || rc=1
mpiexec -n 2 "$PY" benchmarks/cuda_staging.py "$@" 2>&1 | tee "$LOGS/bench.log" || rc=1
echo "logs in $LOGS"
exit $rc
