#!/usr/bin/env python
"""What the torch DistributedOptimizer's hyperparameter check
(gradflow/torch/hyperparameter_check.py) costs a training step. Every round
folds the param groups' values into a CRC, and every 16th round's
allreduces carry it as their step tag, so that round and the next miss the
response cache and negotiate through rank 0 (native Note [Step tags]).

One model, one optimizer; blocks of 64 steps alternate between the check as
shipped (CHECK_EVERY = 16) and the check switched off (CHECK_EVERY so large
that no round is tagged; the CRC is still folded, so "off" still pays the
fold: its cost is measured separately, in one process). Every rank switches
at the same step. Model: a 24-layer MLP of width 256 (1.6 M parameters, 48
tensors) in pool buckets of 256 KiB (25 buckets: many names, so the cache
misses cost as much as they can), batch 32, SGD with momentum. Small on
purpose: a short step shows the fixed per-step cost.

    mpiexec -n 2 python benchmarks/hyperparameter_check_cost.py --blocks 21

Prints, on rank 0, the median milliseconds per step of each mode and the
fold's microseconds; writes every block to
benchmarks/results/hyperparameter_check_cost-<N>.json.
"""
from __future__ import annotations

import argparse
import time
import timeit

import torch
import torch.nn.functional as F
from _benchutil import report_check_modes  # run as a script: benchmarks/ is on sys.path

import gradflow.torch as hvd
from gradflow import hyperparameter_tag as tag
from gradflow.torch import hyperparameter_check as hc

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--blocks", type=int, default=21, help="blocks per mode")
parser.add_argument("--steps", type=int, default=64, help="steps per block")
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
torch.manual_seed(0)
layers = []
for _ in range(24):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                               named_parameters=model.named_parameters(), bucket_mb=0.25)
gen = torch.Generator().manual_seed(R)
x = torch.randn(32, 256, generator=gen)
y = torch.randint(0, 10, (32,), generator=gen)


def block(check_every: int) -> float:
    tag.CHECK_EVERY = check_every  # read by both frameworks' checks
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - t0) / args.steps * 1e3


MODES = {"check every 16": 16, "no tagged round": 1 << 40}
block(16)  # warm-up: the pool is built after the first step
times = {m: [] for m in MODES}
for b in range(args.blocks):
    for mode in (MODES if b % 2 == 0 else reversed(list(MODES))):
        times[mode].append(block(MODES[mode]))
fold_us = timeit.timeit(lambda: hc.fold(0, opt.param_groups), number=2000) / 2000 * 1e6
if R == 0:
    report_check_modes("hyperparameter_check_cost", N, args.steps, times, "check every 16",
                       "no tagged round", {"fold_us": fold_us},
                       f"the fold: {fold_us:.1f} us per round")
