# examples/pytorch_synthetic_benchmark.py — throughput of DistributedOptimizer
# on a small CNN with synthetic data, in the manner of Horovod's
# pytorch_synthetic_benchmark.py: images/s per rank and in total, with the
# gradient pool on or off, a 16-bit wire, or CSC sparse communication.
"""Synthetic-data training throughput of gradflow.torch (images/s)."""
from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import gradflow.torch as hvd


class SmallCNN(torch.nn.Module):
    """32x32x3 -> 3 conv blocks -> linear; ~0.3 M parameters."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.c3 = torch.nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = torch.nn.Linear(128 * 4 * 4, 128)
        self.fc2 = torch.nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true", help="16-bit wire, fp32 sums")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--use-pool", dest="use_pool", action="store_true", default=True,
                      help="lazy allreduce over the gradient pool (default)")
    pool.add_argument("--no-pool", dest="use_pool", action="store_false",
                      help="copy path: per-tensor allreduce through the fusion buffer")
    p.add_argument("--sparse-ratio", type=float, default=None,
                   help="CSC: fraction of chunks sent per step (default GRADFLOW_SPARSE_RATIO)")
    p.add_argument("--bucket-mb", type=float, default=None, help="pool bucket size in MiB")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return p.parse_args()


def log(msg: str) -> None:
    if hvd.rank() == 0:
        print(msg, flush=True)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, use_pool=args.use_pool,
                                         sparse_ratio=args.sparse_ratio, bucket_mb=args.bucket_mb)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    n_params = sum(p.numel() for p in model.parameters())
    log(f"Model: SmallCNN ({n_params / 1e6:.2f} M parameters), batch size {args.batch_size}, "
        f"{hvd.size()} rank(s), pool={'on' if args.use_pool else 'off'}, "
        f"wire={'fp16' if args.fp16_allreduce else 'fp32'}, sparse_ratio={args.sparse_ratio}")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    hvd.reset_stats()
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    totals = hvd.allgather_object(float(mean))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {sum(totals):.1f}")
    st = hvd.stats()
    log(f"fusion.bytes_copied={st.get('fusion.bytes_copied', 0):.0f}  "
        f"bytes_sent={st.get('bytes_sent', 0):.0f}  "
        f"seconds_transfer={st.get('seconds_transfer', 0):.3f}")


if __name__ == "__main__":
    main()
