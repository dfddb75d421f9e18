#!/usr/bin/env bash
# Sets everything up in ./.venv (fresh machine: only Python 3.11 needed) and
# runs the whole test suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# Build isolation fetches setuptools, pybind11 and the mpich wheel (for mpicxx).
.venv/bin/python -m pip install -q -c scripts/ci-constraints.txt ".[all]"
# The *installed* package is what is tested (GRADFLOW_TEST_INSTALLED; the
# pytest launcher does not put the source tree on sys.path).
export MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
export GRADFLOW_TEST_INSTALLED=1
exec .venv/bin/pytest -p no:cacheprovider -q -rs --durations=40 tests "$@"
