#!/usr/bin/env python
"""Wire dtypes and coarse-grained sparse communication (CSC) on one large
gradient-sized buffer (default 21 M float32 = 84 MB, the gradient of a
21 M-parameter MLP), in one command.

    python benchmarks/compression_bench.py -np 2
    sudo python benchmarks/compression_bench.py -np 4 --netns --output t.md   # emulated 1 Gbit/s cluster

Modes (each in its own process group: the settings are read at init()):
  fp32, fp16, bf16      GRADFLOW_WIRE_DTYPE, dense
  sparse-0.1, sparse-0.01
                        GRADFLOW_SPARSE_RATIO with GRADFLOW_SPARSE_CHUNK=32768
                        (fp32 wire, no warm-up steps)
  sparse-0.01-fp16      both
  mpi4py                MPI_Allreduce(IN_PLACE) baseline, dense fp32
All gradflow modes use GRADFLOW_ALLREDUCE_ALGO=ring (--algo to change) and
gradflow.torch.allreduce_async_(..., compression=Compression.default) so the
environment decides. Reported per mode: median wall time of one allreduce
(slowest rank; for CSC it includes residual update, chunk selection and
packing), gradflow's own seconds_transfer per allreduce (time inside the
collectives), bytes_sent per allreduce and rank from gradflow.stats(), and
the speed-up / byte reduction against dense fp32.

The data are Gaussian (a fixed seed per rank); the gradient is re-submitted
every iteration (as a training step would), so CSC's residual builds up as
in training. The first call of each mode is checked: dense results against
an fp64 reference (tolerance per wire dtype) and bitwise equal on all ranks;
CSC results: exactly k = ceil(ratio * chunks) chunks non-zero, equal to the
reference there.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402

DEFAULT_MODES = "fp32,fp16,bf16,sparse-0.1,sparse-0.01,mpi4py"
TOL = {"fp32": 1e-5, "fp16": 3e-3, "bf16": 3e-2}


def mode_env(mode: str, algo: str, chunk: int):
    if mode == "mpi4py":
        return {}
    env = {"GRADFLOW_ALLREDUCE_ALGO": algo, "GRADFLOW_WIRE_DTYPE": "fp32"}
    parts = mode.split("-")
    for i, p in enumerate(parts):
        if p in ("fp32", "fp16", "bf16"):
            env["GRADFLOW_WIRE_DTYPE"] = p
        elif p == "sparse":
            env["GRADFLOW_SPARSE_RATIO"] = parts[i + 1]
            env["GRADFLOW_SPARSE_CHUNK"] = str(chunk)
            env["GRADFLOW_SPARSE_WARMUP_STEPS"] = "0"
    return env


# ====================================================================== worker

def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, nranks = comm.Get_rank(), comm.Get_size()
    n = args.elements
    rng = np.random.default_rng(1234 + rank)
    grad = rng.standard_normal(n, dtype=np.float32)
    ref = grad.astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, ref, op=MPI.SUM)
    buf = grad.copy()
    refill = lambda: np.copyto(buf, grad)  # noqa: E731
    check = {}
    gf = None
    if args.mode == "mpi4py":
        op = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # noqa: E731
        refill()
        op()
        err = float(np.max(np.abs(buf - ref)) / np.max(np.abs(ref)))
        check = {"rel_error": err, "ok": err < TOL["fp32"]}
    else:
        import torch
        import gradflow
        import gradflow.torch as gt
        gf = gradflow
        gradflow.init()
        t = torch.from_numpy(buf)
        wire = os.environ.get("GRADFLOW_WIRE_DTYPE", "fp32")
        ratio = float(os.environ.get("GRADFLOW_SPARSE_RATIO", "1"))

        def run(name):
            gt.allreduce_async_(t, op=gradflow.Sum, name=name,
                                compression=gradflow.Compression.default).wait()
        op = lambda: run("grad")  # noqa: E731
        # --- correctness of the first call (own name: its own, empty residual)
        refill()
        run("check")
        crc = zlib.crc32(buf.tobytes())
        same = len(set(comm.allgather(crc))) == 1
        if ratio >= 1:
            err = float(np.max(np.abs(buf - ref)) / np.max(np.abs(ref)))
            check = {"rel_error": err, "bitwise_equal_ranks": same, "ok": same and err < TOL[wire]}
        else:
            chunk = int(os.environ["GRADFLOW_SPARSE_CHUNK"])
            nchunks = math.ceil(n / chunk)
            k = max(1, min(nchunks, math.ceil(ratio * nchunks)))
            pad = np.zeros(nchunks * chunk, np.float32)
            pad[:n] = buf
            nz = np.flatnonzero(np.any(pad.reshape(nchunks, chunk) != 0, axis=1))
            mask = np.zeros(nchunks * chunk, bool)
            for c in nz:
                mask[c * chunk:(c + 1) * chunk] = True
            mask = mask[:n]
            err = float(np.max(np.abs(buf[mask] - ref[mask])) / np.max(np.abs(ref))) if nz.size else float("inf")
            check = {"chunks_nonzero": int(nz.size), "k_expected": k, "rel_error_sent": err,
                     "bitwise_equal_ranks": same,
                     "ok": same and nz.size == k and err < TOL[wire] and not np.any(buf[~mask])}
        gradflow.reset_stats()
    check["all_ranks_ok"] = comm.allreduce(bool(check["ok"]), op=MPI.LAND)
    del ref
    bu.timed_iterations(comm, op, args.warmup, refill)
    if gf:
        gf.reset_stats()
    times = bu.timed_iterations(comm, op, args.iters, refill)
    rec = {"mode": args.mode, "nranks": nranks, "elements": n, "bytes": 4 * n, "iters": args.iters,
           "times": times, "median": bu.median(times), "min": min(times), "check": check}
    if gf:
        st = gf.stats()
        rec["stats_per_op"] = {k: v / args.iters for k, v in st.items()}
        rec["bytes_sent_per_op"] = st.get("bytes_sent", 0.0) / args.iters
        rec["seconds_transfer_per_op"] = st.get("seconds_transfer", 0.0) / args.iters
        rec["algo_counts"] = {k[len("allreduce.count."):]: v for k, v in st.items()
                              if k.startswith("allreduce.count.")}
    else:
        rec["bytes_sent_per_op"] = 2.0 * (nranks - 1) / nranks * 4 * n  # algorithmic, not counted
    # every rank's bytes (ranks can differ by a segment's rounding)
    rec["bytes_sent_per_op_by_rank"] = comm.gather(rec["bytes_sent_per_op"], root=0)
    if rank == 0:
        with open(args.json_out, "w") as f:
            json.dump({"result": rec, "env": {k: v for k, v in os.environ.items()
                                              if k.startswith(("GRADFLOW_", "MPIR_CVAR", "FI_"))}}, f)
        print(f"{args.mode}: median {bu.fmt_time(rec['median'])} bytes/op {rec['bytes_sent_per_op']:.3e} "
              f"check {check}", flush=True)


# ====================================================================== driver

def run_driver(args, cluster) -> None:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    info = bu.machine_info()
    cmdline = bu.script_cmdline()

    def start(m, label):
        wargs = [os.path.abspath(__file__), "--worker", "--mode", m, "--elements", str(args.elements),
                 "--iters", str(args.iters), "--warmup", str(args.warmup)]
        return bu.run_group(label, args.np, cluster, wargs, mode_env(m, args.algo, args.chunk),
                            args.timeout)

    runs = bu.run_interleaved(modes, args.repeat, start)
    info["loadavg_end"] = list(os.getloadavg())
    res = {}
    problems = []
    for m in modes:
        ok = [r["result"] for r in runs[m] if "result" in r and not r.get("error")]
        for r in runs[m]:
            if r.get("error"):
                problems.append(f"- {m}: {r['error']} — `{r['command']}`\n\n```\n{r.get('output_tail', '')}\n```")
        if not ok:
            continue
        rec = dict(ok[0])
        rec["run_medians"] = [r["median"] for r in ok]
        rec["median"] = bu.median(rec["run_medians"])
        rec["seconds_transfer_per_op"] = bu.median([r.get("seconds_transfer_per_op", float("nan")) for r in ok])
        rec["checks"] = [r["check"] for r in ok]
        res[m] = rec
        for r in ok:
            if not r["check"].get("all_ranks_ok"):
                problems.append(f"- {m}: WRONG result on the first call: {r['check']}")
            if m != "mpi4py":
                want = f"{mode_env(m, args.algo, args.chunk)['GRADFLOW_ALLREDUCE_ALGO']}." \
                       f"{mode_env(m, args.algo, args.chunk)['GRADFLOW_WIRE_DTYPE']}"
                # CSC's chunk-importance allreduce is always fp32 (one per step): allowed
                allowed = {want} | ({want.split(".")[0] + ".fp32"} if "sparse" in m else set())
                others = {k for k in r.get("algo_counts", {}) if k not in allowed}
                if others:
                    problems.append(f"- {m}: expected only {want} allreduces, counters: {r['algo_counts']}")
    base = res.get("fp32")
    head = ["mode", "time (median)", "speed-up vs fp32", "gradflow seconds_transfer", "transfer speed-up vs fp32",
            "bytes sent / allreduce / rank", "bytes vs fp32", "chunks sent / step", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in modes:
        r = res.get(m)
        if r is None:
            lines.append(f"| {m} | FAIL | | | | | | | |")
            continue
        st = r.get("stats_per_op", {})
        chunks = (f"{st['sparse.chunks_sent']:.0f} of {st['sparse.chunks_total']:.0f}"
                  if "sparse.chunks_sent" in st else "—")
        tr = r.get("seconds_transfer_per_op") if m != "mpi4py" else None
        bytes_note = "" if m != "mpi4py" else " (algorithmic)"
        cells = [m, bu.fmt_time(r["median"]),
                 f"{base['median'] / r['median']:.2f}x" if base else "—",
                 bu.fmt_time(tr) if tr is not None else "—",
                 f"{base['seconds_transfer_per_op'] / tr:.2f}x" if base and tr else "—",
                 f"{r['bytes_sent_per_op'] / 1e6:.2f} MB{bytes_note}",
                 f"{base['bytes_sent_per_op'] / r['bytes_sent_per_op']:.1f}x fewer" if m != "fp32" else "1x" if base and r["bytes_sent_per_op"] else "—",
                 chunks, "ok" if all(c.get("all_ranks_ok") for c in r["checks"]) else "WRONG"]
        lines.append("| " + " | ".join(cells) + " |")
    where = bu.netns_desc(cluster)
    text = (f"allreduce(sum) of {args.elements} float32 ({args.elements * 4 / 1e6:.0f} MB), {args.np} ranks, "
            f"{where}, algo {args.algo}, chunk {args.chunk}; {info['date']}, {info['cpus']} cores, "
            f"load avg at start {info['loadavg'][0]:.2f} / end {info['loadavg_end'][0]:.2f}; "
            f"{args.iters} timed iterations x {args.repeat} process groups per mode\n`{cmdline}`\n\n"
            + "\n".join(lines) + "\n")
    for m in modes:
        noisy = bu.noisy_medians(res[m]["run_medians"]) if m in res else None
        if noisy:
            problems.append(f"- note: {m}: {noisy}")
    bu.finish_report(args, cluster, info, cmdline, text, problems,
                     modes=res, runs=runs, table="\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--np", type=int, default=2)
    p.add_argument("--elements", type=int, default=21_000_000, help="float32 elements (default 21 M = 84 MB)")
    p.add_argument("--modes", default=DEFAULT_MODES)
    p.add_argument("--algo", default="ring", help="GRADFLOW_ALLREDUCE_ALGO for the gradflow modes")
    p.add_argument("--chunk", type=int, default=32768, help="GRADFLOW_SPARSE_CHUNK for the sparse modes")
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1, help="process groups per mode, interleaved")
    bu.add_driver_worker_args(p)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    bu.driver_or_worker(p.parse_args(), worker, run_driver)


if __name__ == "__main__":
    main()
