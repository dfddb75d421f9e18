"""TensorBoard monitoring of gradflow's counters on 2 and 3 ranks:
gradflow.torch.StatsLogger and gradflow.keras.callbacks.TensorBoardStatsCallback
write scalars from rank 0 only, equal to the gradflow.stats() deltas
(stats_monitor_script.py reads the event files back)."""
import importlib.util
import re

import pytest

from _launch import run_mpi


def _have(*names: str) -> bool:
    return all(importlib.util.find_spec(n) is not None for n in names)


# Short stall check: the script makes rank 1 arrive 4 s late once.
ENV = {"GRADFLOW_STALL_CHECK_TIME": "1.5"}


def _oks(out, n):
    return re.findall(rf"ok [^\n]*?\(size {n}\)", out.stdout)


@pytest.mark.skipif(not _have("torch", "tensorboard"), reason="torch and tensorboard are needed")
@pytest.mark.parametrize("n", [2, 3])
def test_torch_stats_logger(n, tmp_path):
    out = run_mpi(n, "stats_monitor_script.py", "torch", str(tmp_path), env=ENV, timeout=240)
    assert len(_oks(out, n)) == 2 * n, out.stdout + out.stderr[-3000:]
    assert "gradflow stall" in out.stderr, out.stderr[-3000:]


@pytest.mark.skipif(not _have("tensorflow", "keras", "tensorboard"),
                    reason="tensorflow, keras and tensorboard are needed")
@pytest.mark.parametrize("n", [2, 3])
def test_keras_tensorboard_stats_callback(n, tmp_path):
    out = run_mpi(n, "stats_monitor_script.py", "keras", str(tmp_path), env=ENV, timeout=300)
    assert len(_oks(out, n)) == 2 * n, out.stdout + out.stderr[-3000:]
