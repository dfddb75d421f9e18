cd $MAIN
# MAIN: this tree, BASE: a worktree of 88f9927 built in place, SCRATCH: a scratch folder holding mpi_b2b.py
export LD_LIBRARY_PATH=$MAIN/.venv/lib MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 PATH=$MAIN/.venv/bin:$PATH
for r in 1 2 3; do for t in base main; do
  tree=$BASE; [ $t = main ] && tree=$MAIN
  for spec in "mlp gf-all" "resnet gf-fp32,gf-all"; do set -- $spec
    out=$SCRATCH/tr_${r}_${t}_$1_$3.json
    python -m benchmarks.cluster run $N --name pf -- env PYTHONPATH=$tree GRADFLOW_SPARSE_CHUNK=32768 GRADFLOW_SPARSE_WARMUP_STEPS=5 python $tree/benchmarks/_trainbench.py --systems $2 --model $1 --batch $([ $1 = mlp ] && echo 32 || echo 16) --warmup 8 --steps 5 --reps 3 --json-out $SCRATCH/tr_${r}_${t}_$1_N$N.json > /dev/null 2>&1
    python3 - $SCRATCH/tr_${r}_${t}_$1_N$N.json $r $t <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); rs=d['results']; rs = rs if isinstance(rs,list) else list(rs.values())
for r in rs:
    s=r.get('stats',{}); steps=8+15
    print(sys.argv[2], sys.argv[3], d.get('model'), r['system'], 'N', d.get('ranks'), 'thr', round(r['throughput'],1), [round(x) for x in r['samples_per_s']], 'cyc/step', round(s.get('negotiation.cycles',0)/steps,1), 'loopcpu', r['thread_cpu_seconds_per_step_rank0'].get('gradflow-loop'), flush=True)
PY
  done; done; done
