"""Lightning's 16-bit AMP plugin with GradflowStrategy and CSC under mpiexec
(tests/parallel/test_lightning.py, 2 and 3 ranks; the caller sets
GRADFLOW_SPARSE_CHUNK small and no CSC warm-up). The strategy must hand the
plugin's GradScaler to DistributedOptimizer as grad_scaler= (the only way a
Lightning user has), so CSC residuals stay in unscaled units: the Lightning
weights must equal, bit for bit, a plain gradflow loop that runs the same
AMP steps with grad_scaler=, and differ from one without it (what the
strategy did before 2026-11-28: residuals kept at the loss scale of the step
that made them, so every growth of the scale halved the unsent remainder).
Final weights bitwise identical across ranks. Prints "ok <check> (size N)"."""
import importlib
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gradflow.torch as hvd
from gradflow.lightning import strategy_classes

os.environ.setdefault("GRADFLOW_FUSION_THRESHOLD", "0")  # the same summation order in both runs
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
pl = importlib.import_module("lightning.pytorch")
MixedPrecision = importlib.import_module("lightning.pytorch.plugins").MixedPrecision
Strategy, _ = strategy_classes("lightning.pytorch")
EPOCHS, BATCH, LR, RATIO = 3, 8, 0.05, 0.3

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(120, 16, generator=g), torch.randint(0, 4, (120,), generator=g)
ds = TensorDataset(X, Y)


def make_net():
    torch.manual_seed(5 + R)  # different on every rank: the broadcast makes them agree
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def make_scaler():
    # A scale that grows every 2 steps: the residual outlives many scales.
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)


def ok(what):
    sys.stdout.write(f"ok {what} (size {N})\n")
    sys.stdout.flush()


def weights(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


model = Module()
plugin = MixedPrecision("16-mixed", "cpu", scaler=make_scaler())
trainer = pl.Trainer(strategy=Strategy(sparse_ratio=RATIO), accelerator="cpu", devices=1,
                     max_epochs=EPOCHS, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, plugins=[plugin])
trainer.fit(model, DataLoader(ds, batch_size=BATCH, shuffle=True))
lightning_w = weights(model.net)
assert trainer.optimizers[0]._gradflow.scaler is plugin.scaler, "the plugin's scaler was not given"
ok("the AMP plugin's GradScaler is the optimizer's grad_scaler")
rows = hvd.allgather(lightning_w.unsqueeze(0))
assert all(torch.equal(rows[0], rows[r]) for r in range(N)), "ranks' weights differ"
ok("final weights bitwise identical across ranks")


def plain_loop(pass_scaler):
    net = make_net()
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    scaler = make_scaler()
    kw = {"grad_scaler": scaler} if pass_scaler else {}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR),
                                   named_parameters=net.named_parameters(), sparse_ratio=RATIO,
                                   **kw)
    sampler = DistributedSampler(ds, num_replicas=N, rank=R, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(net(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
    return weights(net), scaler.get_scale()


with_scaler, scale = plain_loop(True)
without_scaler, _ = plain_loop(False)
assert scale == plugin.scaler.get_scale(), (scale, plugin.scaler.get_scale())
assert not torch.equal(with_scaler, without_scaler), "the scaler made no difference: a weak test"
if R == 0:
    print(f"grad_scaler= changes the weights by up to "
          f"{(with_scaler - without_scaler).abs().max().item():.3g} "
          f"(weights up to {with_scaler.abs().max().item():.3g})", flush=True)
diff = (with_scaler - lightning_w).abs().max().item()
assert torch.equal(with_scaler, lightning_w), diff
ok("Lightning weights equal the plain loop with grad_scaler=, bit for bit")
