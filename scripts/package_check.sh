#!/usr/bin/env bash
# Packaging check (issue 17.8): `python -m build` makes the sdist and, from
# the sdist alone, the wheel; the wheel goes into a fresh venv; from a folder
# outside the source tree `gradflowrun --check-build` and the quickstart's
# training (2 ranks, digits) must work. Uses ./.venv's Python for `build`
# (scripts/test.sh creates it). Exit non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q build
echo "== python -m build (sdist, then the wheel from the sdist)"
.venv/bin/python -m build --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 || {
  tail -40 "$WORK/build.log"; exit 1; }
ls "$WORK/dist"
tar tzf "$WORK"/dist/gradflow-*.tar.gz > "$WORK/sdist.txt"  # (grep -q on a pipe: SIGPIPE)
grep -q "native/api.h" "$WORK/sdist.txt" || { echo "sdist lacks the native headers"; exit 1; }
WHEEL=$(ls "$WORK"/dist/gradflow-*.whl)
echo "== fresh venv from the wheel"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip
"$WORK/venv/bin/python" -m pip install -q -c scripts/ci-constraints.txt "${WHEEL}[torch,examples]"
cd "$WORK"  # outside the source tree: only the installed wheel can be imported
"$WORK/venv/bin/gradflowrun" --check-build
# Horovod compatibility mode from the environment alone (the wheel's .pth).
GRADFLOW_HOROVOD_COMPAT=1 "$WORK/venv/bin/python" -c \
  "import horovod.torch as hvd, gradflow.torch as g; assert hvd is g, hvd"
if "$WORK/venv/bin/python" -c "import horovod" 2>/dev/null; then
  echo "horovod importable with compatibility mode off"; exit 1
fi
timeout 600 "$WORK/venv/bin/gradflowrun" -np 2 "$WORK/venv/bin/python" \
  "$ROOT/examples/pytorch_digits.py" --epochs 3 | tee "$WORK/train.log"
grep -q "test accuracy" "$WORK/train.log" || { echo "quickstart printed no test accuracy"; exit 1; }
echo "package check OK"
