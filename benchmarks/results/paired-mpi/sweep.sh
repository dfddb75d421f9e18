#!/usr/bin/env bash
# Paired gradflow-vs-MPI_Allreduce rounds (back_to_back_latency.py --paired):
# numpy gradflow.allreduce (out of place) and torch allreduce_ (in place) at
# 1, 4 and 16 MiB on 2 and 4 ranks; each launch 6 rounds. Run from the
# repository root with the build to measure on PYTHONPATH.
set -u
for rep in 1 2; do
  for np in 2 4; do
    for spec in 1048576:300 4194304:100 16777216:30; do
      bytes=${spec%%:*}; calls=${spec##*:}
      for api in numpy torch; do
        echo "## rep $rep np $np bytes $bytes api $api"
        timeout 300 mpiexec -n $np python benchmarks/back_to_back_latency.py --bytes $bytes \
          --api $api --paired --calls $calls --blocks 6 2>&1 | grep -v '^\[\|^gradflow'
      done
    done
  done
done
