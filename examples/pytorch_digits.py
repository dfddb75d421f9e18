# examples/pytorch_digits.py — data-parallel training of a small CNN on
# sklearn's digits with gradflow.torch, written the way Horovod examples are:
# data sharded by rank, LR scaled by size, state broadcast from rank 0,
# progress and checkpoints on rank 0 only. Run: gradflowrun -np 2 python examples/pytorch_digits.py
"""Train a small CNN on sklearn digits with gradflow.torch; prints test accuracy."""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import gradflow.torch as hvd


class Net(torch.nn.Module):
    """8x8 grey image -> two 3x3 convs -> linear classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="single-rank LR; scaled by size")
    p.add_argument("--checkpoint", default="", help="checkpoint file (rank 0 writes, resumes from it)")
    p.add_argument("--no-pool", action="store_true", help="copy path instead of the gradient pool")
    p.add_argument("--fp16-allreduce", action="store_true", help="16-bit wire, fp32 sums")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def load_data(seed: int):
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


def save_checkpoint(path: str, model, optimizer, epoch: int) -> None:
    """Rank 0 only: a fresh temp file (mkstemp: unpredictable name, O_EXCL) in
    the target folder, fsynced, then os.replace and an fsync of the folder,
    so a crash leaves the old checkpoint or the new one, never half a file."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-ckpt-")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    xtr, ytr, xte, yte = load_data(args.seed)
    # Shard: rank r takes every size-th example.
    xtr, ytr = xtr[rank::size], ytr[rank::size]

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    start_epoch = 0
    if args.checkpoint and rank == 0 and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
    start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, use_pool=not args.no_pool)

    # Every rank runs the same number of batches (shards differ by at most one example).
    steps = len(xtr) // args.batch_size
    for epoch in range(start_epoch, args.epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(epoch * 1000 + rank))
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{args.epochs}", disable=rank != 0,
                   leave=False)
        for i in bar:
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if args.checkpoint and rank == 0:
            save_checkpoint(args.checkpoint, model, optimizer, epoch)

    # Test accuracy: each rank scores its shard of the test set, counts are summed.
    model.eval()
    with torch.no_grad():
        xs, ys = xte[rank::size], yte[rank::size]
        correct = (model(xs).argmax(1) == ys).sum()
    totals = hvd.allreduce(torch.tensor([float(correct), float(len(ys))]), op=hvd.Sum,
                           name="test_accuracy")
    if rank == 0:
        print(f"test accuracy: {totals[0] / totals[1]:.4f} ({int(totals[0])}/{int(totals[1])}) "
              f"on {size} rank(s)")


if __name__ == "__main__":
    main()
