#!/usr/bin/env bash
# Site-MPI check (issue 17.1): build gradflow and mpi4py against Debian's
# Open MPI (apt-get install openmpi-bin libopenmpi-dev) in their own venv,
# ./.venv-openmpi, then run `gradflowrun --launcher openmpi --check-build` and
# the collective, torch and fault tests with Open MPI's mpirun
# (GRADFLOW_TEST_LAUNCHER=openmpi, see tests/parallel/_launch.py).
#
# Skips (exit 0, says why) where Open MPI's mpirun/mpicxx are not installed;
# GRADFLOW_REQUIRE_OPENMPI=1 turns that skip into a failure (for CI).
# GRADFLOW_OPENMPI_TESTS overrides the test files; extra args go to pytest.
# The mpich wheel is never installed here: gradflow is built without build
# isolation (its build-system list names mpich, for the default pip build)
# and installed with --no-deps, so only Open MPI's libmpi can be linked.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
MPIRUN=${OPENMPI_MPIRUN:-$(command -v mpirun || true)}
MPICXX=${OPENMPI_MPICXX:-$(command -v mpicxx || true)}
MPICC=${OPENMPI_MPICC:-$(command -v mpicc || true)}

skip() {
  if [ "${GRADFLOW_REQUIRE_OPENMPI:-0}" = 1 ]; then
    echo "openmpi_check: FAIL (GRADFLOW_REQUIRE_OPENMPI=1): $*" >&2; exit 1
  fi
  echo "openmpi_check: SKIP: $*"; exit 0
}
[ -n "$MPIRUN" ] || skip "no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)"
"$MPIRUN" --version 2>/dev/null | grep -q "Open MPI" || skip "$MPIRUN is not Open MPI's"
[ -n "$MPICXX" ] && [ -n "$MPICC" ] || skip "no mpicxx/mpicc on PATH (apt-get install libopenmpi-dev)"
"$MPICXX" --showme:version 2>/dev/null | grep -q "Open MPI" || skip "$MPICXX is not Open MPI's wrapper"

VENV=${OPENMPI_VENV:-.venv-openmpi}
SRC=$ROOT/$VENV/src  # a copy of the sources, kept so a rerun compiles only what changed
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY=$ROOT/$VENV/bin/python
"$VPY" -m pip install -q --upgrade pip
echo "== mpi4py from source against $MPICC"
# --no-binary: the PyPI wheel would bring its own MPI choice; MPICC picks the
# compiler wrapper (and so the MPI) mpi4py's build uses.
if ! "$VPY" -c "from mpi4py import MPI; assert MPI.get_vendor()[0] == 'Open MPI'" 2>/dev/null; then
  MPICC="$MPICC" "$VPY" -m pip install -q --no-binary mpi4py --no-cache-dir --force-reinstall \
    "mpi4py>=4"
fi
echo "== numpy, pyyaml, torch, scikit-learn (test data), pytest, build requirements (no mpich)"
"$VPY" -m pip install -q -c scripts/ci-constraints.txt numpy pyyaml torch scikit-learn pytest pytest-timeout \
  "setuptools>=77" wheel "pybind11>=2.12"
echo "== gradflow against $MPICXX (no build isolation, no dependencies)"
# Built from a copy of the tracked files: pip builds in the source folder, and
# the developer build/ objects (compiled against MPICH) must not be reused.
# tar keeps the files' times, so GRADFLOW_INCREMENTAL recompiles only sources
# newer than their objects (a changed header: rm -r "$SRC/build").
mkdir -p "$SRC"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$SRC"
GRADFLOW_MPICXX="$MPICXX" GRADFLOW_INCREMENTAL=1 "$VPY" -m pip install -q --no-build-isolation \
  --no-deps --force-reinstall "$SRC"
if "$VPY" -m pip show mpich >/dev/null 2>&1; then
  echo "openmpi_check: the mpich wheel is installed in $VENV" >&2; exit 1
fi
echo "setup took $((SECONDS - t0)) s"

# Open MPI refuses to run as root without these; ranks may outnumber cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
export GRADFLOW_TEST_INSTALLED=1 GRADFLOW_TEST_LAUNCHER=openmpi GRADFLOW_MPIEXEC="$MPIRUN"
cd "$WORK"  # outside the source tree: the installed (Open MPI) gradflow is imported
echo "== gradflowrun --launcher openmpi --check-build"
"$ROOT/$VENV/bin/gradflowrun" --launcher openmpi --check-build
t1=$SECONDS
TESTS=${GRADFLOW_OPENMPI_TESTS:-"tests/single/test_check_build_mpi.py tests/parallel/test_collectives.py tests/parallel/test_torch.py
  tests/parallel/test_faults.py"}
# shellcheck disable=SC2086
(cd "$ROOT" && "$ROOT/$VENV/bin/pytest" -p no:cacheprovider -q -rs $TESTS "$@")
echo "tests took $((SECONDS - t1)) s; openmpi check OK"
