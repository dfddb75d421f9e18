#!/usr/bin/env bash
# Builds gradflow's native core with AddressSanitizer + UndefinedBehaviorSanitizer
# in a copy of the tree (never touching the in-place build) and runs the
# parallel collectives / errors / techniques / property / soak / reinit /
# lifecycle / join / withdrawn-names scripts under it at 2 and 3 ranks. Exits non-zero on the
# first sanitizer report or failure.
#
#   scripts/sanitize.sh              # build (if stale) + run everything
#   scripts/sanitize.sh --build-only
#   GRADFLOW_ASAN_DIR=/tmp/x NPS="2" scripts/sanitize.sh
#   ONLY="soak property" scripts/sanitize.sh   # a subset of the runs below
#
# A full run (no ONLY, default NPS) records its result in
# benchmarks/results/sanitizers.txt (RESULT= to change or, empty, skip).
# Python: $PYTHON, else the README's ./.venv, else python3. The build
# dependencies (pyproject.toml's [build-system]: setuptools, pybind11) live
# only in pip's isolated build, so they are installed into $DEST/build-deps.
# See docs/sanitizers.md for what it checks and the last result.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${GRADFLOW_ASAN_DIR:-/tmp/gradflow-asan}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=$(command -v python3); fi
MPIEXEC=${MPIEXEC:-$(dirname "$PY")/mpiexec}
if [ -z "${ONLY:-}" ] && [ -z "${NPS:-}" ]; then
  RESULT=${RESULT-"$ROOT/benchmarks/results/sanitizers.txt"}
else
  RESULT=${RESULT:-}
fi
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)
NPS=${NPS:-"2 3"}
PER_RUN_TIMEOUT=${PER_RUN_TIMEOUT:-600}

# 1. Copy the sources (tar: no rsync needed), keeping the copy's build dir.
mkdir -p "$DEST/src"
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.so' --exclude='./build' \
    -cf - setup.py pyproject.toml README.md native gradflow tests | tar -C "$DEST/src" -xf -
SO=$(ls "$DEST"/src/gradflow/_native*.so 2>/dev/null | head -1 || true)
# The stamp covers the sources and the Python (its venv's libmpi is the
# build's RUNPATH): a build left in $DEST by another checkout or venv, e.g. a
# CI run elsewhere on this machine, is rebuilt, not loaded with a dead path.
STAMP=$( (cd "$DEST/src" && cat setup.py native/*.cc native/*.h; echo "$PY") | sha256sum | cut -c1-16)
if [ -z "$SO" ] || [ "$(cat "$DEST/stamp" 2>/dev/null)" != "$STAMP" ]; then
  # Build requirements minus mpich (a runtime dependency: its mpicxx is
  # beside Python already), installed once per requirement list.
  REQS=$(sed -n '/^\[build-system\]/,/^\[/s/^requires *= *\[\(.*\)\]/\1/p' "$ROOT/pyproject.toml" \
         | tr -d '"' | tr ',' '\n' | sed 's/^ *//; s/ *$//' | grep -v '^mpich' | tr '\n' ' ')
  if [ "$(cat "$DEST/build-deps/.requires" 2>/dev/null)" != "$REQS" ]; then
    echo "sanitize.sh: installing build dependencies ($REQS) into $DEST/build-deps" >&2
    rm -rf "$DEST/build-deps"
    # shellcheck disable=SC2086  # one word per requirement
    "$PY" -m pip install -q --disable-pip-version-check --target "$DEST/build-deps" $REQS \
      >"$DEST/pip.log" 2>&1 || { tail -20 "$DEST/pip.log" >&2
        echo "sanitize.sh: cannot install the build dependencies" >&2; exit 1; }
    echo "$REQS" > "$DEST/build-deps/.requires"
  fi
  echo "sanitize.sh: building with -fsanitize=address,undefined in $DEST/src" >&2
  rm -f "$DEST"/src/gradflow/_native*.so
  (cd "$DEST/src" && PYTHONPATH="$DEST/build-deps" GRADFLOW_SANITIZE=address,undefined \
     "$PY" setup.py -q build_ext --inplace --build-temp "$DEST/build-temp" \
     --build-lib "$DEST/build-lib" >"$DEST/build.log" 2>&1) || {
    tail -50 "$DEST/build.log" >&2; echo "sanitize.sh: build failed" >&2; exit 1; }
  echo "$STAMP" > "$DEST/stamp"
fi
[ "${1:-}" = "--build-only" ] && { echo "sanitize.sh: built $(ls "$DEST"/src/gradflow/_native*.so)"; exit 0; }

# 2. Run the SPMD scripts. python itself is not instrumented, so libasan must
# be preloaded; libstdc++ too, or ASan's __cxa_throw interceptor finds no real
# function (libstdc++ is loaded later, with the extension) and aborts on the
# first C++ exception. CPython and MPICH leak by design: leak checks off.
LIBASAN=$(gcc -print-file-name=libasan.so)
LIBSTDCXX=$(gcc -print-file-name=libstdc++.so.6)
PRELOAD="$LIBASAN $LIBSTDCXX"
LOGDIR="$DEST/logs"
rm -rf "$LOGDIR"; mkdir -p "$LOGDIR"
export PYTHONPATH="$DEST/src" OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=10
SCRIPTS="$DEST/src/tests/parallel"
{
fail=0
run() {  # run NAME N [ENV=VALUE ...] -- SCRIPT [ARGS]
  local label=$1 n=$2; shift 2
  case " ${ONLY:-$label} " in *" $label "*) ;; *) return 0 ;; esac
  local envs=()
  while [ "$1" != "--" ]; do envs+=(-genv "${1%%=*}" "${1#*=}"); shift; done
  shift
  local t0=$SECONDS rc=0 tag="$label.n$n"
  timeout "$PER_RUN_TIMEOUT" "$MPIEXEC" "${envs[@]}" -genv LD_PRELOAD "$PRELOAD" \
      -genv ASAN_OPTIONS "detect_leaks=0:halt_on_error=1:log_path=$LOGDIR/$tag.asan" \
      -genv UBSAN_OPTIONS "print_stacktrace=1:halt_on_error=1:log_path=$LOGDIR/$tag.ubsan" \
      -n "$n" "$PY" "$SCRIPTS/$1" "${@:2}" >"$LOGDIR/$tag.out" 2>&1 || rc=$?
  local reports; reports=$(cd "$LOGDIR" && ls | grep -E "^$tag\.(asan|ubsan)\." || true)
  if [ $rc != 0 ] || [ -n "$reports" ]; then
    echo "FAIL $label n=$n rc=$rc ($((SECONDS - t0)) s) reports: ${reports:-none}; log $LOGDIR/$label.n$n.out"
    fail=1
  else
    echo "ok   $label n=$n ($((SECONDS - t0)) s)"
  fi
}
for n in $NPS; do
  run collectives "$n" -- collectives_script.py
  run errors "$n" GRADFLOW_STALL_SHUTDOWN_TIME=3 GRADFLOW_STALL_CHECK_TIME=1 -- errors_script.py
  run techniques-ring "$n" GRADFLOW_ALLREDUCE_ALGO=ring -- techniques_script.py
  run techniques-two-sync "$n" GRADFLOW_ALLREDUCE_ALGO=two-sync -- techniques_script.py
  run techniques-sparse "$n" GRADFLOW_SPARSE_RATIO=0.1 GRADFLOW_SPARSE_CHUNK=1000 -- techniques_script.py
  run property "$n" GRADFLOW_TIMEOUT=20 -- property_script.py --examples 40
  # ASan's quarantine (256 MiB) holds freed memory: RSS says nothing here.
  run soak "$n" -- soak_script.py --ops 500 --rss-bound-mb 100000
  run reinit "$n" -- reinit_script.py
  # Handle lifetime (dropped handles, grouped submits that raise) and
  # shutdown() racing waiters: where use-after-free would show first.
  run lifecycle-handles "$n" -- lifecycle_handles_script.py
  run lifecycle-threads "$n" -- lifecycle_threads_script.py
  run join "$n" GRADFLOW_STALL_SHUTDOWN_TIME=10 GRADFLOW_STALL_CHECK_TIME=5 -- join_script.py together
  # Withdrawn names: requests without buffers, a retry held in the queue.
  run withdrawn "$n" -- withdrawn_names_script.py
done
if [ $fail = 0 ]; then
  echo "sanitize.sh: clean (no ASan/UBSan reports) at ranks: $NPS"
else
  for f in "$LOGDIR"/*.asan.* "$LOGDIR"/*.ubsan.*; do
    [ -e "$f" ] && { echo "== $f"; head -40 "$f"; }
  done
  echo "sanitize.sh: FAILED (logs in $LOGDIR)"
fi
} 2>&1 | tee "$LOGDIR/summary.txt"
fail=$(grep -q "^sanitize.sh: clean" "$LOGDIR/summary.txt" && echo 0 || echo 1)
if [ -n "$RESULT" ]; then
  { echo "# scripts/sanitize.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$ROOT" diff --quiet HEAD -- native setup.py 2>/dev/null || echo ' + local changes')"
    echo "# $(gcc --version | head -1); $("$PY" -c 'import mpi4py.MPI as M; print(M.Get_library_version().splitlines()[0])'); Python $("$PY" -c 'import platform; print(platform.python_version())'); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    cat "$LOGDIR/summary.txt"; } > "$RESULT"
  echo "sanitize.sh: result written to $RESULT"
fi
exit "$fail"
