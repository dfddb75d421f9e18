"""PyTorch Lightning's Trainer with gradflow.lightning.GradflowStrategy under
mpiexec on 2 and 3 ranks (lightning_script.py holds the checks: weights
bitwise equal across ranks and equal to a plain gradflow.torch loop, >= 95 %
test accuracy on digits, one checkpoint writer, sync_dist averaging, the
strategy's collectives). Skipped where Lightning is not installed."""
import importlib.util
import re

import pytest

from _launch import run_mpi


def _have(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # "lightning.pytorch" when "lightning" is absent
        return False


needs_torch = pytest.mark.skipif(not _have("torch") or not _have("sklearn"),
                                 reason="torch and scikit-learn are needed")
CHECKS = 8  # "ok ..." lines per rank in dense mode; options mode adds one


def _oks(out, n):
    return re.findall(rf"ok [^\n]*?\(size {n}\)", out.stdout)


@needs_torch
@pytest.mark.skipif(not _have("lightning.pytorch"), reason="lightning is not installed")
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("mode", ["dense", "options"])
def test_lightning_trainer_matches_plain_loop(n, mode, tmp_path):
    env = {"GRADFLOW_SPARSE_CHUNK": "64", "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}
    out = run_mpi(n, "lightning_script.py", "lightning.pytorch", mode, str(tmp_path),
                  env=env, timeout=600)
    assert len(_oks(out, n)) == n * (CHECKS + (mode == "options")), out.stdout


@needs_torch
@pytest.mark.skipif(not _have("pytorch_lightning"), reason="pytorch-lightning is not installed")
def test_pytorch_lightning_package(tmp_path):
    out = run_mpi(2, "lightning_script.py", "pytorch_lightning", "dense", str(tmp_path),
                  timeout=600)
    assert len(_oks(out, 2)) == 2 * CHECKS, out.stdout


@needs_torch
@pytest.mark.skipif(not _have("lightning.pytorch"), reason="lightning is not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_lightning_amp_plugin_scaler_reaches_csc(n):
    """Lightning's 16-bit AMP plugin + CSC: the strategy gives the plugin's
    GradScaler to DistributedOptimizer as grad_scaler= (lightning_amp_script.py:
    bitwise equal to a plain loop with grad_scaler=; fails on the old strategy
    by 0.015)."""
    env = {"GRADFLOW_SPARSE_CHUNK": "16", "GRADFLOW_SPARSE_WARMUP_STEPS": "0"}
    out = run_mpi(n, "lightning_amp_script.py", env=env, timeout=300)
    assert len(_oks(out, n)) == n * 3, out.stdout


@needs_torch
@pytest.mark.skipif(not _have("lightning.pytorch"), reason="lightning is not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_lightning_fresh_fit_takes_no_initialising_step(n):
    """AdamW with weight decay under GradflowStrategy equals Lightning's DDP
    (one process on the union of the batches): no Horovod-style initialising
    step on empty optimizer states (lightning_adam_script.py; fails on the
    old strategy: Adam step 5 after 4 steps, weights 0.0044 off)."""
    out = run_mpi(n, "lightning_adam_script.py", timeout=300)
    assert len(_oks(out, n)) == n * 2, out.stdout


@needs_torch
@pytest.mark.skipif(not _have("lightning.pytorch"), reason="lightning is not installed")
@pytest.mark.parametrize("n", [2, 3])
def test_lightning_manual_optimization(n):
    """automatic_optimization = False: one optimizer with clip_gradients, and
    a GAN with two optimizers, equal to the DDP reference (lightning_manual_script.py;
    every opt.step() raised GradflowError on the old strategy); and the
    strategy's all_gather(sync_grads=True) with DDP's gradient."""
    out = run_mpi(n, "lightning_manual_script.py", timeout=300)
    assert len(_oks(out, n)) == n * 3, out.stdout
