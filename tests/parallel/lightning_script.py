"""PyTorch Lightning + gradflow.lightning.GradflowStrategy under mpiexec
(tests/parallel/test_lightning.py). A LightningModule (small MLP) trains on
scikit-learn's digits through Trainer; then a plain gradflow.torch loop
(DistributedSampler + DistributedOptimizer, same seed, split, optimizer and
options) trains a second copy, and the script checks: final weights bitwise
identical across ranks and bitwise equal to the plain loop's, test accuracy >= 95 %,
the checkpoint written by rank 0 only (once per epoch, the file on disk
holding the final weights), sync_dist logging averaged across ranks, the
sampler split, and the strategy's reduce/all_gather/broadcast/barrier.

argv: PACKAGE (lightning.pytorch | pytorch_lightning) MODE (dense | options)
CKPT_DIR (shared by the ranks). MODE options = fp16 wire + CSC (sparse_ratio
0.5; the caller sets GRADFLOW_SPARSE_CHUNK small) + accumulate_grad_batches 2
+ small pool buckets: equality with the plain loop run with the same options
shows they reached the wrapper. Prints "ok <check> (size N)" per check.
"""
import glob
import importlib
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gradflow.torch as hvd
from gradflow.lightning import strategy_classes

package, mode, ckpt_dir = sys.argv[1], sys.argv[2], sys.argv[3]
# Fusion groups tensors by what is ready in a cycle (timing), and on 3+ ranks
# the ring's summation order depends on the fused buffer's length; without
# fusion both runs sum in the same order and must agree bit for bit.
os.environ.setdefault("GRADFLOW_FUSION_THRESHOLD", "0")
warnings.filterwarnings("ignore")  # Lightning's advice on num_workers etc.
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
pl = importlib.import_module(package)
io_mod = importlib.import_module(("lightning.fabric" if package == "lightning.pytorch"
                                  else "lightning_fabric") + ".plugins")
Strategy, Environment = strategy_classes(package)

EPOCHS, BATCH, LR = (10 if mode == "options" else 5), 16, 0.1  # accumulation halves the steps
ACCUMULATE = 2 if mode == "options" else 1
OPT_KWARGS = ({"compression": hvd.Compression.fp16, "sparse_ratio": 0.5, "bucket_mb": 0.01}
              if mode == "options" else {})


def ok(what: str) -> None:
    sys.stdout.write(f"ok {what} (size {N})\n")  # one write: ranks' lines never interleave
    sys.stdout.flush()


X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
train_ds = TensorDataset(torch.from_numpy(Xtr), torch.from_numpy(ytr), torch.arange(len(Xtr)))
test_ds = TensorDataset(torch.from_numpy(Xte), torch.from_numpy(yte), torch.arange(len(Xte)))


def make_net() -> torch.nn.Module:
    # A different initialisation on every rank: the strategy's broadcast from
    # rank 0 (and the plain loop's broadcast_parameters) must make them agree.
    torch.manual_seed(100 + R)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


class DigitsModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_net()
        self.seen = {}  # epoch -> sample indices this rank trained on

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, t, idx = batch
        self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
        loss = F.cross_entropy(self.net(x), t)
        self.log("train_loss", loss, sync_dist=True, on_step=False, on_epoch=True)
        self.log("rank_value", float(R), sync_dist=True, on_step=False, on_epoch=True)
        self.log("rank_unsynced", float(R), on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, t, _ = batch
        self.log("val_acc", (self.net(x).argmax(1) == t).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        # The scheduler is made before the strategy wraps the optimizer (as
        # every Lightning user does): its learning rate must still apply.
        opt = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": make_scheduler(opt)}


def make_scheduler(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)  # per epoch


class CountingIO(io_mod.TorchCheckpointIO):
    """Counts the checkpoint writes this rank really performs."""
    saves = 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        CountingIO.saves += 1
        super().save_checkpoint(checkpoint, path, storage_options)


# ------------------------------------------------------------------ Lightning
model = DigitsModule()
strategy = Strategy(**OPT_KWARGS)
trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=EPOCHS,
                     accumulate_grad_batches=ACCUMULATE, default_root_dir=ckpt_dir, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, plugins=[CountingIO()])
trainer.fit(model, DataLoader(train_ds, batch_size=BATCH, shuffle=True),
            DataLoader(test_ds, batch_size=64))
stats = hvd.stats()
lightning_w = torch.cat([p.detach().reshape(-1) for p in model.net.parameters()])

assert (trainer.global_rank, trainer.world_size, trainer.local_rank) == \
    (R, N, hvd.local_rank()), (trainer.global_rank, trainer.world_size, trainer.local_rank)
assert strategy.distributed_sampler_kwargs == {"num_replicas": N, "rank": R}
assert isinstance(trainer.strategy.cluster_environment, Environment)
assert trainer.is_global_zero == (R == 0)
assert type(trainer.optimizers[0]).__name__ == "SGD" and hasattr(trainer.optimizers[0], "_gradflow")
assert trainer.optimizers[0].backward_passes_per_step == ACCUMULATE
assert abs(trainer.optimizers[0].param_groups[0]["lr"] - LR * 0.7 ** (EPOCHS // 2)) < 1e-12
ok("ranks, world size, environment, wrapped optimizer and its LR schedule")

everyone_seen = hvd.allgather_object(model.seen)
per_rank = -(-len(Xtr) // N)  # DistributedSampler pads to a multiple of N
for e in range(EPOCHS):
    parts = [s[e] for s in everyone_seen]
    assert all(len(p) == per_rank for p in parts), [len(p) for p in parts]
    assert set().union(*map(set, parts)) == set(range(len(Xtr)))
assert everyone_seen[0][0] != everyone_seen[0][1], "the sampler did not reshuffle per epoch"
ok("distributed sampler: every sample every epoch, one shard per rank, reshuffled per epoch")

rows = hvd.allgather(lightning_w.unsqueeze(0))
assert all(torch.equal(rows[0], rows[r]) for r in range(N)), "ranks' weights differ"
ok("final weights bitwise identical across ranks")

metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
assert metrics["rank_value"] == (N - 1) / 2, metrics
assert metrics["rank_unsynced"] == R, metrics  # control: without sync_dist each rank keeps its own
same = hvd.allgather_object((metrics["train_loss"], metrics["val_acc"]))
assert all(s == same[0] for s in same), same
ok("sync_dist logging averages across ranks")

if mode == "options":
    fp16 = sum(v for k, v in stats.items()
               if k.startswith("allreduce.count.") and k.endswith(".fp16"))
    assert fp16 > 0 and stats.get("sparse.steps", 0) > 0, stats
    assert stats["sparse.chunks_sent"] < stats["sparse.chunks_total"], stats
    ok("options reached the optimizer: fp16 wire and CSC ran")

# ------------------------------------------------------------------ checkpoint
saves = hvd.allgather_object(CountingIO.saves)
assert saves == [EPOCHS] + [0] * (N - 1), saves
hvd.barrier()
files = glob.glob(os.path.join(ckpt_dir, "**", "*.ckpt"), recursive=True)
assert len(files) == 1, files  # save_top_k=1: the last epoch's replaced the earlier ones
ckpt = torch.load(files[0], map_location="cpu", weights_only=False)
assert ckpt["epoch"] == EPOCHS - 1, ckpt["epoch"]
on_disk = torch.cat([ckpt["state_dict"][f"net.{n}"].reshape(-1) for n, _ in
                     model.net.named_parameters()])
assert torch.equal(on_disk, lightning_w)
ok("checkpoint written by rank 0 only, once per epoch, holding the final weights")

# ------------------------------------------------------------------ strategy collectives
s = trainer.strategy
assert s.reduce(torch.tensor(float(R)), reduce_op="sum").item() == N * (N - 1) / 2
assert s.reduce(torch.tensor(R)).item() == (N - 1) / 2  # mean of ints is a float mean
assert s.reduce(torch.tensor([R, -R]), reduce_op="max").tolist() == [N - 1, 0]
assert s.reduce(torch.tensor(float(R)), reduce_op=torch.distributed.ReduceOp.MIN).item() == 0
assert s.reduce("not a tensor") == "not a tensor"
gathered = s.all_gather(torch.tensor([R, 2 * R]))
assert gathered.tolist() == [[r, 2 * r] for r in range(N)], gathered
assert s.all_gather(torch.tensor(float(R))).tolist() == [float(r) for r in range(N)]
assert s.broadcast({"from": R}, src=N - 1) == {"from": N - 1}
s.barrier("check")
assert s.reduce_boolean_decision(R == 0, all=True) is False
assert s.reduce_boolean_decision(R == 0, all=False) is True
assert s.reduce_boolean_decision(True) is True
try:
    s.reduce(torch.tensor(1.0), reduce_op="prod")
    raise AssertionError("reduce_op='prod' was accepted")
except ValueError as e:
    assert "unsupported reduce_op" in str(e)
ok("strategy reduce / all_gather / broadcast / barrier / boolean decision")

# ------------------------------------------------------------------ plain gradflow loop
ref = make_net()
hvd.broadcast_parameters(ref.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9),
                               named_parameters=ref.named_parameters(),
                               backward_passes_per_step=ACCUMULATE, **OPT_KWARGS)
sched = make_scheduler(opt)
sampler = DistributedSampler(train_ds, num_replicas=N, rank=R, shuffle=True, seed=0)
loader = DataLoader(train_ds, batch_size=BATCH, sampler=sampler)
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    for i, (x, t, _) in enumerate(loader):
        if i % ACCUMULATE == 0:
            opt.zero_grad()
        loss = F.cross_entropy(ref(x), t)
        (loss / ACCUMULATE if ACCUMULATE > 1 else loss).backward()
        if (i + 1) % ACCUMULATE == 0 or i + 1 == len(loader):  # Lightning steps on the last batch
            opt.step()
    sched.step()
ref_w = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
diff = (ref_w - lightning_w).abs().max().item()
assert torch.equal(ref_w, lightning_w), diff
ok("Lightning weights equal the plain gradflow loop's, bit for bit")

with torch.no_grad():
    acc = (model.net(torch.from_numpy(Xte)).argmax(1).numpy() == yte).mean()
assert acc >= 0.95, acc
ok(f"test accuracy {acc:.4f} >= 0.95")
