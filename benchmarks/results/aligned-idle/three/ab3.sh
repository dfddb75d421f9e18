#!/bin/bash
# three trees, mlp gf-all+fl only: base (579e825), main (idle naps + aligned idle sleeps,
# ../idle_nap_and_aligned_sleep.patch), var (idle naps only). Usage: [ORDER=..] ab3.sh ROUNDS N OUTDIR
MAIN=${MAIN:?this tree}; BASE=${BASE:?}; VAR=${VAR:?}; N=$2; OUT=$3; R=$1
cd $MAIN
export LD_LIBRARY_PATH=$MAIN/.venv/lib MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 PATH=$MAIN/.venv/bin:$PATH
for r in $(seq 1 $R); do for t in ${ORDER:-base main var}; do
  case $t in base) tree=$BASE;; main) tree=$MAIN;; var) tree=$VAR;; esac
  js=$OUT/tr3_${r}_${t}_N$N.json
  python -m benchmarks.cluster run $N --name t3 -- env PYTHONPATH=$tree GRADFLOW_SPARSE_CHUNK=32768 GRADFLOW_SPARSE_WARMUP_STEPS=5 python $tree/benchmarks/_trainbench.py --systems gf-all+fl --model mlp --batch 32 --warmup 8 --steps 5 --reps 3 --json-out $js > /dev/null 2>&1
  python3 - $js $r $t <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); rs=d['results']; rs = rs if isinstance(rs,list) else list(rs.values())
for r in rs:
    s=r.get('stats',{}); cyc=s.get('negotiation.cycles',0)
    print(sys.argv[2], sys.argv[3], 'N', d.get('ranks'), 'thr', round(r['throughput'],1), [round(x) for x in r['samples_per_s']], 'cycles', cyc, 'idle_ex', s.get('negotiation.idle_exchanges'), 'thr_cpu', r['thread_cpu_seconds_per_step_rank0'], flush=True)
PY
done; done
