"""GradflowStrategy with AdamW (weight decay) under mpiexec
(tests/parallel/test_lightning.py, 2 and 3 ranks): a fresh fit must train
as Lightning's DDP does, i.e. as one process on the union of the ranks'
batches (the same DistributedSampler split Lightning injects): no extra
initialising optimizer step. Before 2026-11-28 the strategy's setup called
broadcast_optimizer_state on the empty states, which takes Horovod's
initialising step on zero gradients: Adam's step count was one ahead
(5 after 4 steps) and AdamW's weight decay was applied once more (weights
0.0044 off after 4 steps at 2 ranks). Prints "ok <check> (size N)"."""
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gradflow.torch as hvd
from gradflow.lightning import strategy_classes
import lightning.pytorch as pl

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
Strategy, _ = strategy_classes("lightning.pytorch")
BATCH = 8
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
ds = TensorDataset(X, Y)


def ok(what):
    sys.stdout.write(f"ok {what} (size {N})\n")
    sys.stdout.flush()


def make_net():
    torch.manual_seed(3)
    return torch.nn.Linear(8, 1)


def make_opt(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.5)


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return make_opt(self.parameters())


model = Module()
trainer = pl.Trainer(strategy=Strategy(), accelerator="cpu", devices=1, max_epochs=1,
                     logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False)
trainer.fit(model, DataLoader(ds, batch_size=BATCH))

# Lightning's DDP equivalent: one process, each step on every rank's batch
# (Lightning injects a shuffled DistributedSampler, seed 0, for training).
ref = make_net()
opt = make_opt(ref.parameters())
parts = [list(DistributedSampler(ds, num_replicas=N, rank=r, shuffle=True, seed=0))
         for r in range(N)]
steps = -(-len(parts[0]) // BATCH)
for s in range(steps):
    opt.zero_grad()
    batches = [p[s * BATCH:(s + 1) * BATCH] for p in parts]
    loss = sum(F.mse_loss(ref(X[b]), Y[b]) for b in batches) / N
    loss.backward()
    opt.step()
count = trainer.optimizers[0].state[model.net.weight]["step"].item()
assert count == steps, f"Adam's step count is {count} after {steps} steps"
ok("no initialising optimizer step: Adam's step count equals the steps taken")
for got, want in zip(model.net.parameters(), ref.parameters()):
    diff = (got - want).abs().max().item()
    assert diff <= 1e-6, diff
rows = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.net.parameters()]).unsqueeze(0))
assert all(torch.equal(rows[0], rows[r]) for r in range(N)), "ranks' weights differ"
ok("AdamW weights equal the single-process (DDP) reference, identical on every rank")
