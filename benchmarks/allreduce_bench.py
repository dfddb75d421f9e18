#!/usr/bin/env python
"""Allreduce(sum) of a float32 buffer: gradflow's algorithms against
MPI_Allreduce (mpi4py) and torch.distributed gloo, in one command.

    python benchmarks/allreduce_bench.py -np 2                  # shared memory, 2 ranks
    python benchmarks/allreduce_bench.py -np 4 --output t.md    # 4 ranks (oversubscribed on 2 cores)
    sudo python benchmarks/allreduce_bench.py -np 2 --netns --sizes 1MiB,4MiB,16MiB,64MiB
        # on an emulated 1 Gbit/s cluster (benchmarks/cluster/), built for the run
        # and removed after; --rate/--delay change the link, --cluster NAME uses
        # one already up (python -m benchmarks.cluster up 2 --name NAME)

The driver starts one process group per system (GRADFLOW_ALLREDUCE_ALGO is
read at gradflow.init(), so each algorithm needs its own processes), each
under `mpiexec -n NP` (with --netns: one rank per emulated host) and a timeout,
merges their JSON results and prints a markdown table: per size and system
the median time of one allreduce (slowest rank, barrier before each
iteration) and the bus bandwidth 2(N-1)/N * bytes / time; plus the ratios
gradflow-ring / MPI_Allreduce and gradflow-ring / gloo of bus bandwidth.

Systems:
  gradflow-ring, gradflow-two-sync, gradflow-mpi, gradflow-recursive-doubling
                 gradflow.torch.allreduce_ (in place, zero copy, op=Sum) with
                 GRADFLOW_ALLREDUCE_ALGO=<algo>; includes gradflow's
                 own overhead (submit, coordination cycle of
                 GRADFLOW_CYCLE_TIME=1 ms default, completion).
  gradflow-<algo>-numpy  the numpy API gradflow.allreduce (allocates the result
                 and copies the input into it), for comparison.
  mpi4py         comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM).
  gloo           torch.distributed.all_reduce on a gloo process group.
Every system's result is checked once per size against the exact sum
(integer-valued data), and gradflow's counters confirm which algorithm ran.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402

DEFAULT_SIZES = ",".join(f"{4 ** k * 4}KiB" for k in range(0, 9))  # 4 KiB .. 256 MiB
DEFAULT_SYSTEMS = "gradflow-ring,gradflow-two-sync,gradflow-mpi,mpi4py,gloo"


# ====================================================================== worker

def _free_port(addr: str) -> int:
    import socket
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def worker(args) -> None:
    import numpy as np
    system = args.system
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, nranks = comm.Get_rank(), comm.Get_size()
    gf = None
    if system.startswith("gradflow"):
        import torch
        import gradflow
        import gradflow.torch as gt
        gradflow.init()
        gf = gradflow
        assert gradflow.size() == nranks
        numpy_api = system.endswith("-numpy")
    elif system == "gloo":
        import torch
        import torch.distributed as dist
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        if addr == "127.0.0.1":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        port = comm.bcast(_free_port(addr) if rank == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=nranks)
    elif system != "mpi4py":
        raise SystemExit(f"unknown system {system}")

    results = []
    meta = {"system": system, "nranks": nranks, "env": {k: v for k, v in os.environ.items()
                                                         if k.startswith(("GRADFLOW_", "MPIR_CVAR", "FI_"))}}

    def dump():
        if rank == 0:
            with open(args.json_out, "w") as f:
                json.dump({"meta": meta, "results": results}, f)

    for nbytes in [bu.parse_size(s) for s in args.sizes.split(",")]:
        n = nbytes // 4
        base = (np.arange(n, dtype=np.int64) % 7).astype(np.float32)
        fill = base + np.float32(rank + 1)
        expected = base * np.float32(nranks) + np.float32(nranks * (nranks + 1) // 2)
        del base
        buf = fill.copy()
        name = f"bench.{nbytes}"
        out_holder = [None]
        if system == "mpi4py":
            op = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # noqa: E731
            result = lambda: buf  # noqa: E731
        elif system == "gloo":
            t = torch.from_numpy(buf)
            op = lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM)  # noqa: E731
            result = lambda: buf  # noqa: E731
        elif numpy_api:
            def op():
                out_holder[0] = gf.allreduce(buf, op=gf.Sum, name=name)
            result = lambda: out_holder[0]  # noqa: E731
        else:
            t = torch.from_numpy(buf)
            op = lambda: gt.allreduce_(t, op=gf.Sum, name=name)  # noqa: E731
            result = lambda: buf  # noqa: E731
        refill = lambda: np.copyto(buf, fill)  # noqa: E731
        iters = bu.iters_for(nbytes, args.iters, args.min_iters, bu.parse_size(args.budget))
        # first call: correctness (exact: integer-valued data), then warm-up
        refill()
        op()
        ok = bool(np.array_equal(result(), expected))
        bad = None if ok else float(np.max(np.abs(result() - expected)))
        all_ok = comm.allreduce(ok, op=MPI.LAND)
        del expected
        bu.timed_iterations(comm, op, args.warmup, refill)
        stats0 = gf.stats() if gf else None
        if gf:
            gf.reset_stats()
        times = bu.timed_iterations(comm, op, iters, refill)
        rec = {"bytes": nbytes, "iters": iters, "times": times, "median": bu.median(times),
               "min": min(times), "correct": all_ok}
        if bad is not None:
            rec["max_abs_error_rank%d" % rank] = bad
        if gf:
            st = gf.stats()
            rec["algo_counts"] = {k[len("allreduce.count."):]: v for k, v in st.items()
                                  if k.startswith("allreduce.count.")}
            rec["bytes_sent_per_op"] = st.get("bytes_sent", 0.0) / iters
            rec["seconds_transfer_median_est"] = st.get("seconds_transfer", 0.0) / iters
            del stats0
        results.append(rec)
        dump()
        if rank == 0:
            print(f"{system} {bu.fmt_size(nbytes)}: median {bu.fmt_time(rec['median'])} "
                  f"busbw {bu.busbw(nbytes, nranks, rec['median']) / 1e9:.3f} GB/s "
                  f"correct={all_ok}", flush=True)
        del buf, fill
    dump()
    if system == "gloo":
        dist.destroy_process_group()


# ====================================================================== driver

def merge_runs(runs):
    """One record per size over the repetitions: median = median of the runs'
    medians; every run's times are kept."""
    out = {"runs": runs, "command": runs[0].get("command"), "results": []}
    errors = [r for r in runs if r.get("error")]
    if errors:
        out["error"] = errors[0]["error"]
        out["output_tail"] = errors[0].get("output_tail", "")
        out["failed_runs"] = len(errors)
    sizes = sorted({rec["bytes"] for r in runs for rec in r.get("results", [])})
    for nb in sizes:
        recs = [rec for r in runs for rec in r.get("results", []) if rec["bytes"] == nb]
        m = dict(recs[0])
        m["run_medians"] = [rec["median"] for rec in recs]
        m["median"] = bu.median(m["run_medians"])
        m["min"] = min(rec["min"] for rec in recs)
        m["correct"] = all(rec["correct"] for rec in recs)
        m["times"] = [t for rec in recs for t in rec["times"]]
        out["results"].append(m)
    return out


def make_table(merged: dict, systems, nranks: int) -> str:
    sizes = sorted({r["bytes"] for s in systems for r in merged[s].get("results", [])})
    head = ["size"]
    for s in systems:
        head += [f"{s} time", f"{s} busbw GB/s"]
    head += ["ring / MPI_Allreduce", "ring / gloo"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nb in sizes:
        row = [bu.fmt_size(nb)]
        bw = {}
        for s in systems:
            rec = next((r for r in merged[s].get("results", []) if r["bytes"] == nb), None)
            if rec is None:
                row += ["FAIL" if merged[s].get("error") else "—", "—"]
                continue
            bw[s] = bu.busbw(nb, nranks, rec["median"])
            mark = "" if rec["correct"] else " WRONG"
            row += [bu.fmt_time(rec["median"]) + mark, f"{bw[s] / 1e9:.3f}"]
        for ref in ("mpi4py", "gloo"):
            if "gradflow-ring" in bw and bw.get(ref):
                row.append(f"{bw['gradflow-ring'] / bw[ref]:.2f}x")
            else:
                row.append("—")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def run_driver(args, cluster) -> None:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    info = bu.machine_info()
    cmdline = bu.script_cmdline()

    def start(s, label):
        extra = {}
        if s.startswith("gradflow-"):
            algo = s[len("gradflow-"):]
            algo = algo[: -len("-numpy")] if algo.endswith("-numpy") else algo
            extra["GRADFLOW_ALLREDUCE_ALGO"] = algo
        wargs = [os.path.abspath(__file__), "--worker", "--system", s, "--sizes", args.sizes,
                 "--iters", str(args.iters), "--min-iters", str(args.min_iters),
                 "--warmup", str(args.warmup), "--budget", args.budget]
        return bu.run_group(label, args.np, cluster, wargs, extra, args.timeout)

    runs = bu.run_interleaved(systems, args.repeat, start)
    merged = {s: merge_runs(runs[s]) for s in systems}
    info["loadavg_end"] = list(os.getloadavg())
    table = make_table(merged, systems, args.np)
    where = bu.netns_desc(cluster)
    header = (f"allreduce(sum) float32, {args.np} ranks, {where}; {info['date']}, "
              f"{info['cpus']} cores, load avg at start {info['loadavg'][0]:.2f} "
              f"/ end {info['loadavg_end'][0]:.2f}\n`{cmdline}`\n")
    problems = []
    for s in systems:
        m = merged[s]
        if m.get("error"):
            problems.append(f"- {s}: {m['error']} — `{m['command']}`\n\n```\n{m.get('output_tail', '')}\n```")
        for r in m.get("results", []):
            if not r["correct"]:
                problems.append(f"- {s}: WRONG result at {bu.fmt_size(r['bytes'])}: {r}")
            counts = r.get("algo_counts")
            if counts is not None:
                want = s[len("gradflow-"):].replace("-numpy", "")
                ran = {k.split(".")[0] for k in counts}
                if ran != {want}:
                    problems.append(f"- {s}: at {bu.fmt_size(r['bytes'])} gradflow ran {counts}")
    for s in systems:
        for r in merged[s].get("results", []):
            noisy = bu.noisy_medians(r.get("run_medians", []))
            if noisy:
                problems.append(f"- note: {s} at {bu.fmt_size(r['bytes'])}: {noisy}")
    bu.finish_report(args, cluster, info, cmdline, header + "\n" + table + "\n", problems,
                     systems=merged, table=table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", "--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list, e.g. 4KiB,1MiB (default 4 KiB..256 MiB by x4)")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS)
    p.add_argument("--iters", type=int, default=30, help="max timed iterations per size")
    p.add_argument("--min-iters", type=int, default=7, help="min timed iterations per size")
    p.add_argument("--budget", default="1GiB", help="timed bytes per size: iters = clamp(budget/size)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1,
                   help="process groups per system, interleaved; table = median of their medians")
    bu.add_driver_worker_args(p, json_help="write all measurements here (for plot_allreduce.py)")
    p.add_argument("--system", help=argparse.SUPPRESS)
    bu.driver_or_worker(p.parse_args(), worker, run_driver)


if __name__ == "__main__":
    main()
