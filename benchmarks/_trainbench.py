"""Shared worker of train_throughput.py and scaling.py: one training-step
throughput measurement of one system on one model, in one process group.

    python benchmarks/_trainbench.py --systems gf-fp32,gf-fp16 --model mlp --json-out R.json

runs under `mpiexec -n N` (gradflow systems, and DDP in shared-memory mode:
rank/size from the PMI_* environment, MASTER_ADDR/MASTER_PORT from the driver),
on the emulated cluster of benchmarks/cluster (`Cluster.command(..., raw=False)`:
gradflow over the emulated network) or in its raw mode (`python -m
benchmarks.cluster run N --raw -- ...`; DDP: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Systems (one name each; the driver sets GRADFLOW_* in the environment):
  torch           one process, plain torch, no library (the speedup baseline)
  gf-pool         gradflow DistributedOptimizer, gradient pool (lazy allreduce) + overlap, fp32 wire
  gf-copy         gradflow DistributedOptimizer(use_pool=False): per-tensor submit + fusion buffer
  gf-copy-nooverlap  same, overlap=False: every gradient submitted by step(), after backward
  gf-fp16         pool + overlap, Compression.fp16 (16-bit wire, fp32 sums)
  gf-csc0.1       pool + overlap, fp32 wire, sparse_ratio=0.1 (CSC)
  gf-csc0.01      pool + overlap, fp32 wire, sparse_ratio=0.01 (CSC)
  gf-all          pool + overlap + fp16 wire + CSC sparse_ratio=0.01
  ddp             torch DistributedDataParallel, gloo
  ddp-fp16        DDP + default_hooks.fp16_compress_hook
  nocomm          N plain-torch processes side by side, no gradient exchange (gloo
                  only for the barrier before each repetition and the slowest
                  rank's time): the machine's measured compute ceiling for N ranks
  nocomm-sync     nocomm with a gloo barrier after each backward: no gradient
                  exchange, but every step waits for the slowest rank, as a
                  synchronous data-parallel step does (what that alone costs)
  NAME+fl         any system above with gradflow.torch.fuse_linear_grad_accumulation
                  applied to the model (weight gradients accumulate in place into
                  an existing .grad); torch+fl and nocomm+fl then zero with
                  set_to_none=False, so .grad persists and the fusion applies

Protocol: `--warmup` steps (not timed; cover the copy-path first step, the
pool build and GRADFLOW_SPARSE_WARMUP_STEPS), then `--reps` repetitions of
`--steps` steps; each repetition starts with a barrier and its time is the
slowest rank's. Throughput of a repetition = N * batch * steps / time; the
result is the median over repetitions. Each rank uses `--threads` torch
threads (1 by default, so N ranks on the 2-core machine use min(N, 2) cores).
Bytes: gradflow.stats()['bytes_sent'] (payload the core sent, this rank) and,
inside an emulated host, the NIC's tx_bytes (everything on the wire,
headers included, any system), both per timed step.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _trainworker as tw  # noqa: E402

import torch
import torch.nn as nn
import torch.nn.functional as F

GF_SYSTEMS = {
    # name: DistributedOptimizer keyword arguments
    "gf-pool": dict(use_pool=True),
    "gf-copy": dict(use_pool=False),
    "gf-copy-nooverlap": dict(use_pool=False, overlap=False),
    "gf-fp32": dict(use_pool=True),
    "gf-fp16": dict(use_pool=True, compression="fp16"),
    "gf-csc0.1": dict(use_pool=True, sparse_ratio=0.1),
    "gf-csc0.01": dict(use_pool=True, sparse_ratio=0.01),
    "gf-all": dict(use_pool=True, compression="fp16", sparse_ratio=0.01),
}
DDP_SYSTEMS = ("ddp", "ddp-fp16", "nocomm", "nocomm-sync")  # the torch.distributed (gloo) family
ALL_SYSTEMS = ("torch",) + tuple(GF_SYSTEMS) + DDP_SYSTEMS


# ---------------------------------------------------------------- models

class WideMLP(nn.Module):
    """Communication-heavy: 1024 -> 4096 -> 4096 -> 1024 -> 10, ReLU; 25.2 M parameters."""

    def __init__(self, widths=(1024, 4096, 4096, 1024), classes=10):
        super().__init__()
        dims = list(widths) + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


class SmallResNet(nn.Module):
    """Compute-heavy: ResNet-style CNN on 32x32x3, stages 32/64/128, one basic block each; ~0.7 M parameters."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.stages = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class AlexNet64(nn.Module):
    """AlexNet-shaped (the GradientFlow paper's model), scaled to 64x64x3: five
    convolutions 64-192-384-256-256 with three max-pools, then two 4096-wide
    fully connected layers and the classifier (dropout as in AlexNet).
    28.7 M parameters, 91 % of them in the fully connected layers: like the
    paper's AlexNet (61 M), communication-heavy."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),          # 64 -> 15 -> 7
            nn.Conv2d(64, 192, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(3, 2),         # 7 -> 3
            nn.Conv2d(192, 384, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, 1, 1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU())                            # 256 x 3 x 3
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(256 * 3 * 3, 4096), nn.ReLU(),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


MODELS = {
    "mlp": (WideMLP, lambda b: torch.randn(b, 1024)),
    "resnet": (SmallResNet, lambda b: torch.randn(b, 3, 32, 32)),
    "alexnet": (AlexNet64, lambda b: torch.randn(b, 3, 64, 64)),
}
DEFAULT_BATCH = {"mlp": 64, "resnet": 32, "alexnet": 32}


def n_params(model_name: str) -> int:
    return sum(p.numel() for p in MODELS[model_name][0]().parameters())


# ---------------------------------------------------------------- helpers


def _env_rank_size():
    for r, s in (("RANK", "WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


# ---------------------------------------------------------------- worker

def split_system(system: str):
    """"NAME[@bMIB][+fl]" -> (NAME, MIB or '', fused): pool buckets of MIB MiB
    (bucket_sweep.py), FusedLinear layers (+fl)."""
    fused = system.endswith("+fl")
    name, _, bucket_mb = (system[:-3] if fused else system).partition("@b")
    return name, bucket_mb, fused


def _gf_optimizer(hvd, model, system):
    name, bucket_mb, _ = split_system(system)
    kw = dict(GF_SYSTEMS[name])
    if bucket_mb:
        kw["bucket_mb"] = float(bucket_mb)
    if kw.get("compression") == "fp16":
        kw["compression"] = hvd.Compression.fp16
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)


def _thread_cpu() -> dict:
    """CPU seconds (user + system) of this process's threads, summed by thread
    name (gradflow's background loop is "gradflow-loop"); {} off Linux."""
    out: dict = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", required=True,
                   help="comma list, one family: torch | gf-* | ddp, ddp-fp16, nocomm (run one after another, "
                        "each on a fresh model and optimizer)")
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--batch", type=int, default=None, help="per rank (default: mlp 64, resnet 32, alexnet 32)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json-out", required=True)
    a = p.parse_args(argv)
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if split_system(s)[0] not in ALL_SYSTEMS:
            raise SystemExit(f"unknown system {s}; known: {', '.join(ALL_SYSTEMS)}")
    family = {("gf" if s.startswith("gf-") else "ddp" if split_system(s)[0] in DDP_SYSTEMS else "torch")
              for s in systems}
    if len(family) != 1:
        raise SystemExit("--systems must be of one family (torch, gf-*, ddp/ddp-fp16/nocomm)")
    family = family.pop()
    torch.set_num_threads(a.threads)
    batch = a.batch or DEFAULT_BATCH[a.model]
    cls, make_x = MODELS[a.model]
    t_init = time.perf_counter()
    hvd = gf = dist = None
    if family == "torch":
        rank, size = 0, 1
        barrier, max_all = tw.step_timing()
    elif family == "gf":
        import gradflow
        import gradflow.torch as hvd
        from mpi4py import MPI
        hvd.init()
        gf = gradflow
        rank, size = hvd.rank(), hvd.size()
        barrier, max_all = tw.step_timing(MPI.COMM_WORLD)
    else:
        import torch.distributed as dist
        rank, size = _env_rank_size()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if os.environ["MASTER_ADDR"] == "127.0.0.1":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size)

        def barrier():
            dist.barrier()

        def max_all(v):
            t = torch.tensor([v], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t.item())
    t_init = time.perf_counter() - t_init
    out = tw.train_worker_record(a, size, batch, t_init)

    for system in systems:
        out["current"] = system
        if rank == 0:
            tw.write_json_atomic(a.json_out, out)
            print(f"[worker] {system}: {size} rank(s), model {a.model}", flush=True)
        torch.manual_seed(0)
        model = cls()
        base, _, fused = split_system(system)
        if fused:
            from gradflow.torch.fused_linear import fuse_linear_grad_accumulation
            fuse_linear_grad_accumulation(model)
        x, y = make_x(batch), torch.randint(0, 10, (batch,))
        net = model
        if family == "gf":
            opt = _gf_optimizer(hvd, model, system)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        elif family == "ddp" and not base.startswith("nocomm"):
            from torch.nn.parallel import DistributedDataParallel as DDP
            net = DDP(model)
            if base == "ddp-fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                net.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        per_step_barrier = base == "nocomm-sync"

        def step():
            opt.zero_grad(set_to_none=not fused)  # gradflow's pool keeps its views either way
            F.cross_entropy(net(x), y).backward()
            if per_step_barrier:
                dist.barrier()  # where a synchronous step waits for the slowest rank
            opt.step()

        r = {"system": system, "params": sum(p.numel() for p in model.parameters())}
        barrier()
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            step()
        barrier()
        r["warmup_seconds"] = time.perf_counter() - t0
        if gf is not None:
            gf.reset_stats()
        tx0 = tw.nic_tx_bytes()
        cpu0 = time.process_time()  # every thread of this process: torch + gradflow's loop
        threads0 = _thread_cpu()
        times = []
        for _ in range(a.reps):
            barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            times.append(max_all(time.perf_counter() - t0))
        tx1 = tw.nic_tx_bytes()
        nsteps = a.reps * a.steps
        # CPU seconds per step of the busiest rank (barriers included): above
        # the step's compute, this is what communication cost the cores.
        r["cpu_seconds_per_step"] = max_all((time.process_time() - cpu0) / nsteps)
        # rank 0's threads, by name (10 ms clock ticks: meaningful over many steps)
        threads1 = _thread_cpu()
        r["thread_cpu_seconds_per_step_rank0"] = {
            k: (v - threads0.get(k, 0.0)) / nsteps for k, v in threads1.items()}
        r["rep_seconds"] = times
        r.update(tw.throughput_fields(times, size, batch, a.steps))
        if tx0 is not None:
            r["nic_tx_bytes_per_step"] = max_all((tx1 - tx0) / nsteps)  # busiest rank
        if gf is not None:
            st = gf.stats()
            r["stats"] = st
            r["bytes_sent_per_step"] = st.get("bytes_sent", 0.0) / nsteps
        # parameters must agree across ranks (a broken reduction would make them diverge)
        s = float(sum(p.detach().double().sum() for p in model.parameters()))
        r["param_checksum_spread"] = max_all(s) + max_all(-s)
        out["results"][system] = r
        if rank == 0:
            print(f"[worker] {system}: {r['throughput']:.1f} samples/s", flush=True)
        if family == "gf":
            for h in opt._gradflow.hook_handles:
                h.remove()
        del opt, net, model
        gc.collect()
    out["current"] = None
    if rank == 0:
        tw.write_json_atomic(a.json_out, out)
    if family == "gf":
        hvd.shutdown()
    elif family == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
