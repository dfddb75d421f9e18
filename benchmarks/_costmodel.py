"""Pure functions of gradflow's step-time cost model (used by benchmarks/scale_model.py).

Ring allreduce time, bucket grouping, CSC chunk arithmetic, the least-squares fit of link
parameters, and the per-step simulation (buckets on one link, overlap with backward, CPU work).
No I/O, no measurement: tests/single/test_scale_model.py tests these directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

# ---------------------------------------------------------------- assumptions
CHUNK_ELEMS = 32768            # GRADFLOW_SPARSE_CHUNK default (chunk of CSC)
POOL_BUCKET_BYTES = 8 << 20    # GRADFLOW_POOL_BUCKET_BYTES default
DDP_BUCKET_BYTES = 25 << 20    # torch DDP bucket_cap_mb default
BACKWARD_SHARE = 2.0 / 3.0     # backward = 2x forward (assumed, not measured here)

# ---------------------------------------------------------------- model sizes

def mlp_tensors(widths: Sequence[int] = (1024, 4096, 4096, 1024), classes: int = 10) -> List[int]:
    """Parameter tensor sizes (elements) of benchmarks/_trainbench.py's WideMLP, forward order."""
    dims = list(widths) + [classes]
    out: List[int] = []
    for a, b in zip(dims[:-1], dims[1:]):
        out += [a * b, b]
    return out


# benchmarks/_trainbench.py SmallResNet, forward order (printed from the model once; 308 650 in all)
SMALL_RESNET_TENSORS = [864, 32, 32, 9216, 32, 32, 9216, 32, 32, 18432, 64, 64, 36864, 64, 64, 2048, 64,
                        64, 73728, 128, 128, 147456, 128, 128, 8192, 128, 128, 1280, 10]


def alexnet_tensors() -> List[int]:
    """torchvision AlexNet (61.1 M parameters), forward order."""
    convs = [(3, 64, 11), (64, 192, 5), (192, 384, 3), (384, 256, 3), (256, 256, 3)]
    out: List[int] = []
    for cin, cout, k in convs:
        out += [cout * cin * k * k, cout]
    for a, b in [(256 * 6 * 6, 4096), (4096, 4096), (4096, 1000)]:
        out += [a * b, b]
    return out


def resnet50_tensors() -> List[int]:
    """torchvision ResNet-50 (25.56 M parameters; BatchNorm weight and bias as tensors), forward order."""
    out = [64 * 3 * 7 * 7, 64, 64]
    cin = 64
    for width, blocks in [(64, 3), (128, 4), (256, 6), (512, 3)]:
        for i in range(blocks):
            cout = width * 4
            out += [width * cin, width, width, width * width * 9, width, width, cout * width, cout, cout]
            if i == 0:
                out += [cout * cin, cout, cout]
            cin = cout
    out += [2048 * 1000, 1000]
    return out


TENSORS: Dict[str, Callable[[], List[int]]] = {
    "mlp": mlp_tensors, "resnet": lambda: list(SMALL_RESNET_TENSORS),
    "alexnet": alexnet_tensors, "resnet50": resnet50_tensors,
}


# ---------------------------------------------------------------- pure model functions

def ring_time(nbytes: float, n: int, bandwidth: float, latency: float, overhead: float = 0.0) -> float:
    """Ring allreduce of nbytes on n ranks: overhead + 2(n-1) latency + 2(n-1)/n * nbytes / bandwidth.

    0 for n = 1 (nothing is sent)."""
    if n <= 1:
        return 0.0
    return overhead + 2 * (n - 1) * latency + 2.0 * (n - 1) / n * nbytes / bandwidth


def make_buckets(tensors: Sequence[int], cap_bytes: int, elem_bytes: int = 4) -> List[int]:
    """Group tensors, in backward (reverse) order, into runs of whole tensors of at most cap_bytes.

    A tensor larger than the cap is a bucket of its own (gradflow's pool and DDP both do this)."""
    out: List[int] = []
    cur = 0
    for t in reversed(list(tensors)):
        if cur and (cur + t) * elem_bytes > cap_bytes:
            out.append(cur)
            cur = 0
        cur += t
        if cur * elem_bytes > cap_bytes:
            out.append(cur)
            cur = 0
    if cur:
        out.append(cur)
    return out


def csc_sent_elems(bucket_elems: int, ratio: float, chunk: int = CHUNK_ELEMS) -> Tuple[int, int]:
    """CSC on one bucket: (chunks in the bucket, elements sent) = at least one chunk, ceil(ratio x chunks)."""
    nchunks = max(1, math.ceil(bucket_elems / chunk))
    k = max(1, math.ceil(ratio * nchunks))
    full = bucket_elems // chunk
    last = bucket_elems - full * chunk
    # the chunks chosen are assumed full-size except when the bucket has only a partial one
    sent = min(bucket_elems, k * chunk) if full else last
    return nchunks, sent


def fit_ring(points: Sequence[Tuple[int, float, float]]) -> Tuple[float, float, float]:
    """Least-squares fit of (bandwidth B/s, latency s, overhead s) to (n, nbytes, seconds) samples.

    Relative least squares, non-negative: a term the data cannot see comes out 0, never negative."""
    from scipy.optimize import nnls
    a = np.array([[1.0, 2.0 * (n - 1), 2.0 * (n - 1) / n * b] for n, b, _ in points])
    y = np.array([t for _, _, t in points])
    # relative residuals: timing noise is a share of the time, so a 1 MiB sample must count as
    # much as a 64 MiB one (otherwise the small terms drown in the big samples' noise)
    a = a / y[:, None]
    y = np.ones_like(y)
    # scale columns so nnls is well conditioned
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(a / scale, y)
    x = x / scale
    overhead, latency, inv_bw = x
    return (1.0 / inv_bw if inv_bw > 0 else math.inf), latency, overhead


@dataclass
class Link:
    """One collective implementation on one network."""
    bandwidth: float   # bytes/s of algorithm payload through one NIC
    latency: float     # s per ring message
    overhead: float    # s per collective

    def allreduce(self, nbytes: float, n: int) -> float:
        return ring_time(nbytes, n, self.bandwidth, self.latency, self.overhead)


@dataclass
class System:
    """How one training system communicates (what the model needs to know)."""
    name: str
    bucket_bytes: int
    wire_bytes: int = 4            # 4 fp32, 2 fp16
    sparse_ratio: float = 1.0      # < 1: CSC
    overlap: float = 1.0           # share of backward that communication can hide behind (0..1)
    codec_s_per_elem: float = 0.0  # fp16 encode+decode, per element passing the ring, CPU of the comm thread
    cpu_s_per_elem: float = 0.0    # on the critical path, per gradient element per step (CSC pass, DDP hook)
    cpu_s_per_sent_elem: float = 0.0  # on the critical path, per CSC element sent (copy out, unpack, re-zero)
    bucket_wait_s: float = 0.0     # extra wait per bucket (Horovod cycle)
    bucket_choices: Tuple[int, ...] = ()  # non-empty: use the fastest of these bucket sizes (autotune-like)
    coord_step_s: float = 0.0      # coordination cost per step (N > 1), x contention
    coord_collective_s: float = 0.0  # coordination cost per collective (N > 1), x contention


@dataclass
class StepBreakdown:
    compute: float
    cpu: float
    comm: float
    exposed: float
    step: float
    bytes_per_rank: float
    collectives: int


def best_step_time(tensors: Sequence[int], n: int, system: System, link: Link, compute_s: float,
                   contention: float = 1.0) -> Tuple[StepBreakdown, int]:
    """step_time with the fastest bucket size of system.bucket_choices (or its own): (breakdown, bytes)."""
    sizes = system.bucket_choices or (system.bucket_bytes,)
    res = [(step_time(tensors, n, replace(system, bucket_bytes=b), link, compute_s, contention), b)
           for b in sizes]
    return min(res, key=lambda x: x[0].step)


def step_time(tensors: Sequence[int], n: int, system: System, link: Link, compute_s: float,
              contention: float = 1.0, backward_share: float = BACKWARD_SHARE) -> StepBreakdown:
    """Time of one synchronous step on n ranks.

    Backward produces gradients at a constant rate per element, in reverse tensor order; a bucket is
    ready when its last tensor is; one link serves buckets first come first served. `overlap` (0..1)
    scales how early a bucket may start: 1 = the moment it is ready, 0 = after the whole backward. CPU work (CSC pass, DDP fp16 hook)
    adds to the step, multiplied by `contention` (how much slower a core is when N ranks share this
    machine; 1 on a cluster). Step = max(compute, last bucket done) + CPU work."""
    buckets = make_buckets(tensors, system.bucket_bytes)
    total = float(sum(tensors))
    bwd = backward_share * compute_s
    link_free = 0.0
    done = 0.0
    comm = 0.0
    sent = 0.0
    colls = 0
    sparse_sent = 0.0
    cum = 0
    frac = 2.0 * (n - 1) / n if n > 1 else 0.0
    for b in buckets:
        cum += b
        ready = compute_s - system.overlap * bwd * (1.0 - cum / total)
        if system.sparse_ratio < 1.0:
            nchunks, elems = csc_sent_elems(b, system.sparse_ratio)
            t = link.allreduce(4.0 * nchunks, n)          # importance allreduce, always fp32
            t += link.allreduce(elems * system.wire_bytes, n)
            sent += frac * (4.0 * nchunks + elems * system.wire_bytes)
            sparse_sent += elems
            colls += 2
        else:
            elems = b
            t = link.allreduce(elems * system.wire_bytes, n)
            sent += frac * elems * system.wire_bytes
            colls += 1
        if n > 1:
            codec = system.codec_s_per_elem * frac * elems * contention
            t = max(t, codec) + system.bucket_wait_s   # codec pipelined with the wire
        else:
            t = 0.0
        start = max(ready, link_free)
        link_free = start + t
        done = link_free
        comm += t
    cpu = (system.cpu_s_per_elem * total + system.cpu_s_per_sent_elem * sparse_sent) * contention
    if n > 1:
        cpu += (system.coord_step_s + system.coord_collective_s * colls) * contention
    finish = max(compute_s, done)
    return StepBreakdown(compute=compute_s, cpu=cpu, comm=comm, exposed=finish - compute_s,
                         step=finish + cpu, bytes_per_rank=sent, collectives=colls)
