#!/usr/bin/env bash
# Sets everything up in ./.venv and trains a real model (scikit-learn's bundled
# digits, no download) on 2 processes through gradflowrun.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c scripts/ci-constraints.txt ".[torch,examples]"
exec .venv/bin/gradflowrun -np 2 .venv/bin/python examples/pytorch_digits.py "$@"
