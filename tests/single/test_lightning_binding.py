"""gradflow.lightning and gradflow.torch.StatsLogger without a launcher (one
process, size 1): the clear ImportError when Lightning is missing, a Trainer fit on one rank, and the
early errors for settings that cannot work (devices != 1, unknown reduce
ops). Each case runs in a fresh interpreter: Lightning and MPI state stay
out of the pytest process."""
import importlib.util
import os
import subprocess
import sys

import pytest

from _launch import rank_env, run_cwd

pytest.importorskip("torch")


def _run(code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=rank_env(), cwd=run_cwd())


def test_missing_lightning_is_a_clear_import_error():
    out = _run("import sys\n"
               "for m in ('lightning', 'lightning.pytorch', 'pytorch_lightning'):\n"
               "    sys.modules[m] = None  # as if not installed\n"
               "try:\n"
               "    import gradflow.lightning\n"
               "except ImportError as e:\n"
               "    print('IMPORTERROR', e)\n")
    assert out.returncode == 0, out.stderr
    assert "IMPORTERROR gradflow.lightning needs PyTorch Lightning 2.x" in out.stdout, out.stdout
    assert "gradflow[lightning]" in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning not installed")
def test_one_rank_fit_and_bad_settings(tmp_path):
    code = f"""
import torch, lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset
from gradflow.lightning import GradflowStrategy
import gradflow

class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(4, 1)
    def training_step(self, b, i):
        loss = ((self.lin(b[0]) - b[1]) ** 2).mean()
        self.log("loss", loss, sync_dist=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
m = M()
t = pl.Trainer(strategy=GradflowStrategy(), accelerator="cpu", devices=1, max_epochs=20,
               logger=False, enable_progress_bar=False, enable_checkpointing=False,
               default_root_dir={str(tmp_path)!r})
t.fit(m, DataLoader(TensorDataset(x, y), batch_size=8))
assert (t.world_size, t.global_rank) == (1, 0)
assert float(t.callback_metrics["loss"]) < 0.05, t.callback_metrics
assert hasattr(t.optimizers[0], "_gradflow")  # gradflow's DistributedOptimizer trained it
assert gradflow.stats().get("allreduce.count", 0) > 0  # sync_dist logging went through the core
print("FIT OK")
try:
    pl.Trainer(strategy=GradflowStrategy(), accelerator="cpu", devices=2)
except ValueError as e:
    assert "devices=1" in str(e), e
    print("DEVICES OK")
try:  # num_nodes is only known when the strategy sets up
    pl.Trainer(strategy=GradflowStrategy(), accelerator="cpu", devices=1, num_nodes=2,
               logger=False, enable_progress_bar=False, enable_checkpointing=False,
               default_root_dir={str(tmp_path)!r}).fit(m, DataLoader(TensorDataset(x, y), batch_size=8))
except ValueError as e:
    assert "num_nodes=2" in str(e), e
    print("NODES OK")
try:
    t.strategy.reduce(torch.tensor(1.0), reduce_op="prod")
except ValueError as e:
    assert "unsupported reduce_op" in str(e), e
    print("REDUCE OK")
try:
    t.strategy.reduce(torch.tensor(1.0), group=object())
except ValueError as e:
    assert "process group" in str(e), e
    print("GROUP OK")
v = torch.tensor([1.0, 2.0], requires_grad=True)
gathered = t.strategy.all_gather(v, sync_grads=True)
assert gathered.shape == (1, 2) and gathered.requires_grad, gathered
(gathered * 3).sum().backward()
assert v.grad.tolist() == [3.0, 3.0], v.grad  # one rank: the row's own gradient
print("SYNC_GRADS OK")
"""
    out = _run(code)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for word in ("FIT OK", "DEVICES OK", "NODES OK", "REDUCE OK", "GROUP OK", "SYNC_GRADS OK"):
        assert word in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


def test_stats_logger_arguments(tmp_path):
    out = _run(f"""
import gradflow.torch as hvd
hvd.init()
d = {str(tmp_path)!r}
for bad in (dict(every=0, log_dir=d), dict(every=True, log_dir=d), {{}}):
    try:
        hvd.StatsLogger(**bad)
        print("ACCEPTED", bad)
    except ValueError as e:
        print("REFUSED", e)
""")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("REFUSED") == 3 and "ACCEPTED" not in out.stdout, out.stdout
    assert "exactly one of log_dir or writer" in out.stdout, out.stdout
