#!/bin/bash
# The MLP scaling rows with and without glibc malloc tuning (every system of a
# run gets the same environment), alternated: tuned, default, tuned, default.
# Run from the repository root as root (network namespaces).
set -u
OUT=benchmarks/results/malloc-tuning
for round in 1 2; do
  for mode in tuned default; do
    if [ "$mode" = tuned ]; then
      export MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=17179869184
    else
      unset MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_
    fi
    echo "== round $round $mode $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    .venv/bin/python benchmarks/scaling.py --models mlp --ranks 2,4 \
      --systems gf-all,nocomm,gf-all+fl,nocomm+fl --steps 5 --docs '' --plots-dir '' \
      --json-out "$OUT/$mode-round$round.json" 2>&1 | tail -25
  done
done
echo "== done $(date -u +%H:%M:%S)"
