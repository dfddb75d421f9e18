# examples/lightning_digits.py — PyTorch Lightning on sklearn's digits with
# gradflow.lightning.GradflowStrategy: the Trainer runs one rank per process
# started by gradflowrun, gradients go through gradflow's DistributedOptimizer,
# rank 0 writes the checkpoint and, with --tensorboard, gradflow's counters.
# Run: gradflowrun -np 2 python examples/lightning_digits.py --tensorboard runs/digits
"""Train an MLP on sklearn digits with PyTorch Lightning + gradflow; prints test accuracy."""
from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import gradflow.torch as hvd
from gradflow.lightning import GradflowStrategy

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch  # each rank scores its shard; sync_dist averages the ranks
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class GradflowTensorBoard(pl.Callback):
    """gradflow's communication counters as TensorBoard scalars (rank 0)."""

    def __init__(self, log_dir: str):
        self.stats = hvd.StatsLogger(log_dir=log_dir, every=10)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.stats.step(trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        self.stats.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fp16-allreduce", action="store_true", help="16-bit wire, fp32 sums")
    p.add_argument("--tensorboard", default="", help="write gradflow's counters here (rank 0)")
    p.add_argument("--root-dir", default="lightning_logs_digits", help="checkpoints go here")
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*(does not have many workers|LeafSpec).*")
    torch.set_num_threads(1)
    hvd.init()

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    xtr, xte, ytr, yte = train_test_split(x, torch.tensor(y), test_size=0.25, random_state=0,
                                          stratify=y)
    torch.manual_seed(0)  # rank 0's initial weights are broadcast by the strategy anyway
    model = DigitsMLP(args.lr)
    strategy = GradflowStrategy(
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=args.epochs,
                         default_root_dir=args.root_dir, logger=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[GradflowTensorBoard(args.tensorboard)] if args.tensorboard
                         else None)
    # Lightning gives each rank its DistributedSampler shard of both loaders.
    train = DataLoader(TensorDataset(xtr, ytr), batch_size=args.batch_size, shuffle=True)
    trainer.fit(model, train, DataLoader(TensorDataset(xte, yte), batch_size=256))
    with torch.no_grad():
        acc = (model.net(xte).argmax(1) == yte).float().mean().item()  # full test set, every rank
    if trainer.is_global_zero:
        print(f"val_acc (ranks averaged) {float(trainer.callback_metrics['val_acc']):.4f}")
        print(f"test accuracy {acc:.4f}")
        print(f"checkpoint: {trainer.checkpoint_callback.best_model_path}")


if __name__ == "__main__":
    main()
