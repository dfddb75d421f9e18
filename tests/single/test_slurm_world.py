"""gradflow.init()'s check for srun without a PMI plugin (every task an MPI
singleton): which environments it refuses and which it lets through. The
real case runs under Slurm in tests/parallel/test_slurm.py."""
import pytest

import gradflow
from gradflow import _runtime

SRUN_NO_PMI = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"}


def test_srun_without_pmi_raises_naming_the_fix():
    with pytest.raises(gradflow.GradflowError, match=r"srun started 2 tasks .*srun --mpi=pmi2"):
        _runtime._check_slurm_world(1, SRUN_NO_PMI)


@pytest.mark.parametrize("size, env", [
    (2, SRUN_NO_PMI),  # a real world
    (1, {"SLURM_STEP_NUM_TASKS": "1"}),  # srun -n 1
    (1, {}),  # not under srun
    (1, {**SRUN_NO_PMI, "PMI_FD": "5"}),  # srun --mpi=pmi2 gave a PMI server
    (1, {**SRUN_NO_PMI, "PMI_RANK": "0"}),  # hydra inside a step (mpiexec -n 1)
    (1, {**SRUN_NO_PMI, "PMIX_RANK": "0"}),
])
def test_worlds_that_are_meant(size, env):
    _runtime._check_slurm_world(size, env)
