#!/usr/bin/env bash
# Site-MPI check (issue 17.1): build gradflow and mpi4py against Debian's
# Open MPI (apt-get install openmpi-bin libopenmpi-dev) in their own venv,
# ./.venv-openmpi, then run `gradflowrun --launcher openmpi --check-build` and
# the collective, torch and fault tests with Open MPI's mpirun
# (GRADFLOW_TEST_LAUNCHER=openmpi, see tests/parallel/_launch.py).
#
# Skips (exit 0, says why) where Open MPI's mpirun/mpicxx are not installed;
# GRADFLOW_REQUIRE_OPENMPI=1 turns that skip into a failure (for CI).
# GRADFLOW_OPENMPI_TESTS: the tests to run: unset = every test in
# test_check_build_mpi.py, test_collectives.py, test_torch.py and
# test_faults.py; `ci` = the focused subset below (CI_TESTS); anything else =
# pytest node ids. Extra args go to pytest.
# CI's cheaper setup (.ci/run sets both):
#   OPENMPI_REUSE_VENV=.venv   take torch, numpy, scikit-learn, pytest, ... from
#       that venv (scripts/test.sh made it) instead of installing them again: a
#       .pth file appends its site-packages after this venv's own, so this
#       venv's mpi4py and gradflow (the Open MPI builds) come first.
#   OPENMPI_FAST_BUILD=1       mpi4py compiled at -O0 (its Cython module is one
#       big C file: -O3 -g takes ~10x the CPU; gradflow's collectives run in
#       gradflow's own core, not in mpi4py) and both without debug info;
#       gradflow itself stays at -O3.
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
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
REUSE_PTH=$SITE/zz-openmpi-check-reuse.pth
rm -f "$REUSE_PTH"  # pip below sees this venv alone (the file is written again at the end)
REUSE_SITE=
if [ -n "${OPENMPI_REUSE_VENV:-}" ]; then
  RPY=$ROOT/$OPENMPI_REUSE_VENV/bin/python
  [ -x "$RPY" ] || { echo "openmpi_check: OPENMPI_REUSE_VENV=$OPENMPI_REUSE_VENV has no bin/python" >&2; exit 1; }
  [ "$("$RPY" -c 'import sys; print(sys.version_info[:2])')" = "$("$VPY" -c 'import sys; print(sys.version_info[:2])')" ] ||
    { echo "openmpi_check: $OPENMPI_REUSE_VENV has another Python version" >&2; exit 1; }
  REUSE_SITE=$("$RPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
fi
# CFLAGS only when asked: mpi4py's build takes an environment CFLAGS in place
# of Python's own flags (-O3 -g), so even an empty one would change them.
MPI4PY_ENV=() GRADFLOW_ENV=()
if [ "${OPENMPI_FAST_BUILD:-0}" = 1 ]; then MPI4PY_ENV=(CFLAGS="-O0 -g0") GRADFLOW_ENV=(CFLAGS=-g0); fi
"$VPY" -m pip install -q --upgrade pip
echo "== mpi4py from source against $MPICC"
# --no-binary: the PyPI wheel would bring its own MPI choice; MPICC picks the
# compiler wrapper (and so the MPI) mpi4py's build uses.
if ! "$VPY" -c "from mpi4py import MPI; assert MPI.get_vendor()[0] == 'Open MPI'" 2>/dev/null; then
  t=$SECONDS
  env MPICC="$MPICC" "${MPI4PY_ENV[@]}" "$VPY" -m pip install -q --no-binary mpi4py \
    --no-cache-dir --force-reinstall "mpi4py>=4"
  echo "mpi4py built in $((SECONDS - t)) s"
fi
if [ -n "$REUSE_SITE" ]; then
  echo "== build requirements (no mpich); torch, numpy, scikit-learn, pytest from $OPENMPI_REUSE_VENV"
  "$VPY" -m pip install -q "setuptools>=77" wheel "pybind11>=2.12" pyyaml numpy
else
  echo "== numpy, pyyaml, torch, scikit-learn (test data), pytest, build requirements (no mpich)"
  "$VPY" -m pip install -q -c scripts/ci-constraints.txt numpy pyyaml torch scikit-learn tqdm pytest \
    pytest-timeout "setuptools>=77" wheel "pybind11>=2.12"
fi
echo "== gradflow against $MPICXX (no build isolation, no dependencies)"
# Built from a copy of the tracked files: pip builds in the source folder, and
# the developer build/ objects (compiled against MPICH) must not be reused.
# tar keeps the files' times, so GRADFLOW_INCREMENTAL recompiles only sources
# newer than their objects (a changed header: rm -r "$SRC/build").
t=$SECONDS
mkdir -p "$SRC"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$SRC"
env GRADFLOW_MPICXX="$MPICXX" GRADFLOW_INCREMENTAL=1 "${GRADFLOW_ENV[@]}" "$VPY" -m pip install -q \
  --no-build-isolation --no-deps --force-reinstall "$SRC"
echo "gradflow built in $((SECONDS - t)) s"
if "$VPY" -m pip show mpich >/dev/null 2>&1; then  # (the reuse .pth is not written yet)
  echo "openmpi_check: the mpich wheel is installed in $VENV" >&2; exit 1
fi
if [ -n "$REUSE_SITE" ]; then
  echo "$REUSE_SITE" > "$REUSE_PTH"
  (cd "$WORK" && "$VPY" -c "import torch, sklearn, pytest, mpi4py, gradflow, os
assert os.path.realpath(mpi4py.__file__).startswith(os.path.realpath('$SITE')), mpi4py.__file__
assert os.path.realpath(gradflow.__file__).startswith(os.path.realpath('$SITE')), gradflow.__file__")
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
ALL_TESTS="tests/single/test_check_build_mpi.py tests/parallel/test_collectives.py tests/parallel/test_torch.py
  tests/parallel/test_faults.py"
# CI's focused subset (GRADFLOW_OPENMPI_TESTS=ci): at 2 and 3 ranks, each
# collective and join, the torch optimizer against one process, its errors
# and CSC, the halving-doubling allreduce against its model (its fold at 3
# ranks), and every fault kind (SIGKILL mid-allreduce, idle and busy, ring and
# two-sync; a rank exiting early; a raising rank; shutdown + init again).
CI_TESTS="tests/single/test_check_build_mpi.py
  tests/parallel/test_collectives.py::test_collectives_match_numpy[3]
  tests/parallel/test_collectives.py::test_join_order_and_every_collective[3-2,0,1]
  tests/parallel/test_collectives.py::test_init_on_sub_communicator[3]
  tests/parallel/test_torch.py::test_torch_ops[2]
  tests/parallel/test_torch.py::test_torch_training_matches_single_process[2]
  tests/parallel/test_torch.py::test_torch_errors_raise_on_every_rank[2]
  tests/parallel/test_torch.py::test_torch_csc_matches_numpy_model[2-ring]
  tests/parallel/test_algorithms.py::test_halving_doubling_matches_model[3]
  tests/parallel/test_faults.py::test_sigkill_stops_the_job_within_seconds[3-1-mid-ring]
  tests/parallel/test_faults.py::test_sigkill_stops_the_job_within_seconds[2-0-idle-ring]
  tests/parallel/test_faults.py::test_sigkill_stops_the_job_within_seconds[3-2-busy-ring]
  tests/parallel/test_faults.py::test_sigkill_stops_the_job_within_seconds[3-1-mid-two-sync]
  tests/parallel/test_faults.py::test_rank_exiting_early_stops_the_job_within_seconds[3]
  tests/parallel/test_faults.py::test_exception_on_one_rank
  tests/parallel/test_faults.py::test_shutdown_then_init_again[2-two-sync]"
case "${GRADFLOW_OPENMPI_TESTS:-}" in
  "") TESTS=$ALL_TESTS ;;
  ci) TESTS=$CI_TESTS ;;
  *) TESTS=$GRADFLOW_OPENMPI_TESTS ;;
esac
set -f  # node ids have brackets: no globbing; -I: the source tree (cwd) is not on sys.path
# shellcheck disable=SC2086
(cd "$ROOT" && "$VPY" -I -m pytest -p no:cacheprovider -q -rs --durations=10 $TESTS "$@")
set +f
echo "tests took $((SECONDS - t1)) s; openmpi check OK ($((SECONDS - t0)) s in all)"
