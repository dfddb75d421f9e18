#!/bin/bash
# benchmarks/run_all.sh [OUTDIR]  -- every table of docs/performance.md, in one go (about 30-40 min on 2 cores).
#   Stages (env STAGES, default "local2 local4 net2 net4"):
#     local2/local4  shared memory, 2 / 4 ranks (4 = oversubscribed on 2 cores, MPIR_CVAR_POLLS_BEFORE_YIELD=10)
#     net2/net4      emulated 1 Gbit/s cluster (benchmarks/cluster/, needs root), 2 / 4 hosts, no added latency
#   The emulated cluster is always removed at exit (also on failure or Ctrl-C). It is named
#   runall<pid> (namespaces gradflow-runall<pid>-*), so it never touches another cluster.
#   PY: the Python with gradflow's dependencies (default: the project's .venv, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${1:-benchmarks/results}
STAGES=${STAGES:-"local2 local4 net2 net4"}
REPEAT_LOCAL=${REPEAT_LOCAL:-3}
REPEAT_NET=${REPEAT_NET:-2}
NET_SIZES=${NET_SIZES:-1MiB,4MiB,16MiB,64MiB}
CL=runall$$
mkdir -p "$OUT"
cleanup() { "$PY" -m benchmarks.cluster down --name "$CL" >/dev/null 2>&1; }
trap cleanup EXIT
trap 'exit 130' INT TERM
SYSTEMS=gradflow-ring,gradflow-two-sync,gradflow-mpi,gradflow-ring-numpy,mpi4py,gloo
MODES=fp32,fp16,bf16,sparse-0.1,sparse-0.01,sparse-0.01-fp16,mpi4py
for st in $STAGES; do
  echo "=== stage $st  ($(date -Is), load: $(cut -d' ' -f1-3 /proc/loadavg))"
  case $st in
    local2|local4)
      np=${st#local}
      export MPIR_CVAR_POLLS_BEFORE_YIELD=10   # only used by MPICH when ranks > cores; harmless otherwise
      $PY benchmarks/allreduce_bench.py -np "$np" --systems $SYSTEMS --repeat "$REPEAT_LOCAL" \
          --output "$OUT/allreduce_shm_np$np.md" --json "$OUT/allreduce_shm_np$np.json"
      $PY benchmarks/compression_bench.py -np "$np" --modes $MODES --repeat "$REPEAT_LOCAL" \
          --output "$OUT/compression_shm_np$np.md" --json "$OUT/compression_shm_np$np.json"
      unset MPIR_CVAR_POLLS_BEFORE_YIELD ;;
    net2|net4)
      np=${st#net}
      "$PY" -m benchmarks.cluster up "$np" --rate 1gbit --delay 0 --name "$CL" || { echo "cluster up failed"; exit 1; }
      $PY benchmarks/allreduce_bench.py -np "$np" --netns --cluster "$CL" --sizes "$NET_SIZES" --systems $SYSTEMS \
          --repeat "$REPEAT_NET" --min-iters 5 --output "$OUT/allreduce_net1g_np$np.md" --json "$OUT/allreduce_net1g_np$np.json"
      $PY benchmarks/compression_bench.py -np "$np" --netns --cluster "$CL" --modes $MODES --repeat "$REPEAT_NET" --iters 5 \
          --output "$OUT/compression_net1g_np$np.md" --json "$OUT/compression_net1g_np$np.json"
      "$PY" -m benchmarks.cluster down --name "$CL" ;;
    *) echo "unknown stage $st"; exit 1 ;;
  esac
done
echo "=== done $(date -Is), load: $(cut -d' ' -f1-3 /proc/loadavg)"
$PY benchmarks/plot_allreduce.py "$OUT"/allreduce_*.json -o docs/allreduce_busbw.png || true
