"""Lightning manual optimization (automatic_optimization = False) with
GradflowStrategy under mpiexec (tests/parallel/test_lightning.py, 2 and 3
ranks): a module with one optimizer that clips its gradients by norm
(self.clip_gradients) before opt.step(), and a GAN with two optimizers
(generator and discriminator, toggle_optimizer), each against one process
stepping on the union of the ranks' batches (Lightning's DDP); ranks
bitwise identical. Also the strategy's all_gather(sync_grads=True) against
DDP's gradient rule (it raised NotImplementedError before 2026-11-28). Before 2026-11-28 every opt.step() of a manually
optimized module raised GradflowError "step()/synchronize() called but no
backward pass produced a gradient" (the strategy waited for a backward
inside Lightning's closure, which runs none in manual mode).
Prints "ok <check> (size N)"."""
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
BATCH, TOL = 8, 1e-5
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(48, 4, generator=g), torch.randn(48, 1, generator=g)
ds = TensorDataset(X, Y, torch.arange(48))
PARTS = [list(DistributedSampler(ds, num_replicas=N, rank=r, shuffle=True, seed=0))
         for r in range(N)]
STEPS = -(-len(PARTS[0]) // BATCH)


def ok(what):
    sys.stdout.write(f"ok {what} (size {N})\n")
    sys.stdout.flush()


def batches(step):
    return [p[step * BATCH:(step + 1) * BATCH] for p in PARTS]


def noise(rank, step):
    return torch.randn(BATCH, 4, generator=torch.Generator().manual_seed(1000 * rank + step))


def fit(module):
    trainer = pl.Trainer(strategy=Strategy(), accelerator="cpu", devices=1, max_epochs=1,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.fit(module, DataLoader(ds, batch_size=BATCH))


def check(module, ref, what):
    for got, want in zip(module.parameters(), ref.parameters()):
        diff = (got - want).abs().max().item()
        assert diff <= TOL, (what, diff)
    rows = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in module.parameters()])
                         .unsqueeze(0))
    assert all(torch.equal(rows[0], rows[r]) for r in range(N)), f"{what}: ranks differ"


# ---------------------------------------------------------------- one optimizer, clipping
def regression_net():
    torch.manual_seed(3)
    return torch.nn.Linear(4, 1)


class Clipped(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = regression_net()

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(F.mse_loss(self.net(x), y))
        self.clip_gradients(opt, gradient_clip_val=0.1, gradient_clip_algorithm="norm")
        opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


module = Clipped()
fit(module)
ref = regression_net()
opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for s in range(STEPS):
    opt.zero_grad()
    (sum(F.mse_loss(ref(X[b]), Y[b]) for b in batches(s)) / N).backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    opt.step()
check(module, ref, "manual optimization with clipping")
ok("manual optimization, clip_gradients: equal to the DDP reference, ranks identical")


# ---------------------------------------------------------------- GAN, two optimizers
def gan_nets():
    torch.manual_seed(4)
    return torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G, self.D = gan_nets()

    def training_step(self, batch, batch_idx):
        x, _, _ = batch
        og, od = self.optimizers()
        z = noise(R, batch_idx)
        self.toggle_optimizer(od)
        od.zero_grad()
        self.manual_backward(F.softplus(-self.D(x)).mean()
                             + F.softplus(self.D(self.G(z).detach())).mean())
        od.step()
        self.untoggle_optimizer(od)
        self.toggle_optimizer(og)
        og.zero_grad()
        self.manual_backward(F.softplus(-self.D(self.G(z))).mean())
        og.step()
        self.untoggle_optimizer(og)

    def configure_optimizers(self):
        return [torch.optim.Adam(self.G.parameters(), lr=0.01),
                torch.optim.Adam(self.D.parameters(), lr=0.01)]


module = GAN()
fit(module)
G, D = gan_nets()
og, od = torch.optim.Adam(G.parameters(), lr=0.01), torch.optim.Adam(D.parameters(), lr=0.01)
for s in range(STEPS):
    zs = [noise(r, s) for r in range(N)]
    od.zero_grad()
    (sum(F.softplus(-D(X[b])).mean() + F.softplus(D(G(z).detach())).mean()
         for b, z in zip(batches(s), zs)) / N).backward()
    od.step()
    og.zero_grad()
    (sum(F.softplus(-D(G(z))).mean() for z in zs) / N).backward()
    og.step()  # D's gradients from this pass are cleared by od.zero_grad() (toggled off in Lightning)
check(module, torch.nn.ModuleList([G, D]), "GAN")
ok("manual optimization, GAN with two optimizers: equal to the DDP reference, ranks identical")


# ---------------------------------------------------------------- all_gather(sync_grads=True)
# Lightning's DDP (torch.distributed.nn's all_gather): the gradient of rank
# r's tensor is the sum over ranks of the gradient of row r. Each rank's
# loss weights row q by q + 1, so rank r's gradient is N * (r + 1).
strategy = module.trainer.strategy
v = torch.full((2,), float(R), requires_grad=True)
rows = strategy.all_gather(v, sync_grads=True)
assert rows.shape == (N, 2) and rows[:, 0].tolist() == [float(r) for r in range(N)], rows
(rows * torch.arange(1.0, N + 1.0)[:, None]).sum().backward()
assert v.grad.tolist() == [float(N * (R + 1))] * 2, v.grad
ok("strategy all_gather(sync_grads=True): DDP's gradient (the sum over ranks)")
