#!/bin/bash
# A/B of the loop thread's scheduler slice, same build, toggled by env.
# Usage: slice_ab.sh ROUNDS N OUTDIR CLUSTER "SLICE_ENV_ON" ; run from the repository root.
R=$1; N=$2; OUT=$3; CL=$4; ON=$5
export LD_LIBRARY_PATH=$PWD/.venv/lib MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 PATH=$PWD/.venv/bin:$PATH
for r in $(seq 1 $R); do
  for spec in "mlp gf-all+fl 32" "resnet gf-fp32 16"; do set -- $spec
    order="off on"; [ $((r % 2)) = 0 ] && order="on off"
    for v in $order; do
      ex="GF_NOTHING=1"; [ $v = on ] && ex="$ON"
      js=$OUT/sl_${r}_${v}_$1_N$N.json
      python -m benchmarks.cluster run $N --name $CL -- env PYTHONPATH=$PWD $ex GRADFLOW_SPARSE_CHUNK=32768 GRADFLOW_SPARSE_WARMUP_STEPS=5 python benchmarks/_trainbench.py --systems $2 --model $1 --batch $3 --warmup 8 --steps 5 --reps 3 --json-out $js > /dev/null 2>&1
      python3 - $js $r $v <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); rs=d['results']; rs = rs if isinstance(rs,list) else list(rs.values())
for r in rs:
    s=r.get('stats',{}); cyc=s.get('negotiation.cycles',0)
    print(sys.argv[2], sys.argv[3], d.get('model'), r['system'], 'N', d.get('ranks'), 'thr', round(r['throughput'],1), [round(x) for x in r['samples_per_s']], 'cycles', cyc, 'loopcpu', r['thread_cpu_seconds_per_step_rank0'].get('gradflow-loop'), 'py', r['thread_cpu_seconds_per_step_rank0'].get('python'), flush=True)
PY
    done
  done
done
