#!/bin/bash
# A/B of the aligned idle exchanges: BASE = a worktree of 579e825 built in place,
# MAIN = this tree. Usage: [ORDER="main base"] train_ab.sh ROUNDS N OUTDIR CLUSTER
MAIN=${MAIN:?this tree}; BASE=${BASE:?a worktree of 579e825 built in place}; R=$1; N=$2; OUT=$3; CL=$4
cd $MAIN
export LD_LIBRARY_PATH=$MAIN/.venv/lib MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 PATH=$MAIN/.venv/bin:$PATH
for r in $(seq 1 $R); do for t in ${ORDER:-base main}; do
  tree=$BASE; [ $t = main ] && tree=$MAIN
  for spec in "mlp gf-all+fl 32" "resnet gf-fp32 16"; do set -- $spec
    js=$OUT/tr_${r}_${t}_$1_N$N.json
    python -m benchmarks.cluster run $N --name $CL -- env PYTHONPATH=$tree GRADFLOW_SPARSE_CHUNK=32768 GRADFLOW_SPARSE_WARMUP_STEPS=5 python $tree/benchmarks/_trainbench.py --systems $2 --model $1 --batch $3 --warmup 8 --steps 5 --reps 3 --json-out $js > /dev/null 2>&1
    python3 - $js $r $t <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); rs=d['results']; rs = rs if isinstance(rs,list) else list(rs.values())
for r in rs:
    s=r.get('stats',{}); cyc=s.get('negotiation.cycles',0)
    print(sys.argv[2], sys.argv[3], d.get('model'), r['system'], 'N', d.get('ranks'), 'thr', round(r['throughput'],1), [round(x) for x in r['samples_per_s']], 'cycles', cyc, 'neg_ms/cycle', round(1e3*s.get('seconds_negotiation',0)/max(cyc,1),2), 'loopcpu', r['thread_cpu_seconds_per_step_rank0'].get('gradflow-loop'), 'cpu/step', round(r['cpu_seconds_per_step'],4), flush=True)
PY
  done; done; done
