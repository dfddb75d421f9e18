#!/usr/bin/env bash
# Slurm check (issue 17.2): installs Debian's slurm-wlm when missing (root with
# apt-get only), then runs tests/parallel/test_slurm.py, which starts its own
# single-node slurmctld + slurmd in a temporary folder, runs srun / salloc /
# sbatch jobs and stops the daemons. Where Slurm cannot be installed or
# started, the tests skip and pytest prints why (-rs).
# Usage: scripts/slurm_check.sh [pytest args]; PY=path/to/python to choose
# the interpreter (default: ./.venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if ! command -v slurmctld >/dev/null || ! command -v srun >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null
  else
    echo "slurm_check: slurm-wlm is not installed and cannot be (needs root and apt-get)" >&2
  fi
fi
export MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2
exec timeout 900 "$PY" -m pytest -p no:cacheprovider -q -rs tests/parallel/test_slurm.py "$@"
