"""NaN, signed zeros and infinities through every allreduce algorithm at 2,
3 and 4 ranks (special_values_script.py): float min/max/sum/product equal the
kernels' rule and are bitwise identical on every rank."""
import pytest

from _launch import run_mpi


@pytest.mark.parametrize("algo", ["ring", "two-sync", "mpi", "recursive-doubling",
                                  "halving-doubling"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_special_values_agree_on_every_rank(algo, n):
    out = run_mpi(n, "special_values_script.py", env={"GRADFLOW_ALLREDUCE_ALGO": algo},
                  timeout=180)
    assert out.stdout.count(f"special values OK on {n} ranks with {algo}") == n, \
        out.stdout + out.stderr
