# Alternating A/B of back_to_back_latency.py: base (88f9927) vs main; MPI_Allreduce reference per group.
# MAIN: this tree, BASE: a worktree of 88f9927 built in place, SCRATCH: a scratch folder holding mpi_b2b.py
cd $MAIN
export LD_LIBRARY_PATH=$MAIN/.venv/lib MPIR_CVAR_POLLS_BEFORE_YIELD=10 OMP_NUM_THREADS=1 PATH=$MAIN/.venv/bin:$PATH
OUT=benchmarks/results/no-empty-exchange
for r in 1 2 3; do
 for cfg in "2 4096 2000 torch" "2 1048576 300 numpy" "2 1048576 300 torch" "4 1048576 300 torch" "4 4096 1000 torch"; do
  set -- $cfg
  echo "== round $r np $1 bytes $2 api $4 load $(cut -d' ' -f1 /proc/loadavg) $(date -u +%H:%M:%S)"
  echo "mpi_allreduce: $(mpiexec -n $1 python $SCRATCH/mpi_b2b.py $2 $3 | awk '{printf "%.1f ", $3}')"
  for t in base main; do
    tree=$BASE; [ $t = main ] && tree=$MAIN
    echo "$t: $(PYTHONPATH=$tree mpiexec -n $1 python $MAIN/benchmarks/back_to_back_latency.py --bytes $2 --calls $3 --api $4 | grep '^rank 0' | sed 's/rank 0: //' | awk '{print ($1=="median")?$2:$0}' | tr '\n' ' ')"
  done
 done
done
