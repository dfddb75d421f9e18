#!/usr/bin/env python
"""Training-step throughput on this machine (shared memory): gradflow's pool
path and copy path against torch DistributedDataParallel (gloo), on 1, 2 and
4 ranks, in one command (issue 3, item 7).

    python benchmarks/train_throughput.py                       # full: 1,2,4 ranks, 2 rounds
    python benchmarks/train_throughput.py --ranks 2 --rounds 1  # one size
    python benchmarks/train_throughput.py --json-out r.json --markdown-out t.md

Each configuration is its own process group, started with a timeout:
  torch      1 process, plain torch, no library (reference)
  gf-pool    gradflow DistributedOptimizer, gradient pool / lazy allreduce (default)
  gf-copy    gradflow DistributedOptimizer(use_pool=False): per-tensor submit, fusion-buffer copies
  ddp        torch.nn.parallel.DistributedDataParallel, gloo, MASTER_ADDR=127.0.0.1
all under `mpiexec -n N` (DDP takes rank/size from MPICH's PMI_RANK/PMI_SIZE).
Model: WideMLP 1024-4096-4096-1024-10 (25.2 M parameters, 96 MiB of fp32
gradients), synthetic data, SGD with momentum, 1 torch thread per rank.
Per configuration: warm-up steps (not timed), then >= 3 timed repetitions;
throughput = median over repetitions (and over rounds: each round runs every
configuration once, interleaved, so slow phases of a noisy machine hit all
systems alike). The table shows samples/s and the ratio gf-pool / ddp.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402
import _traindriver as td  # noqa: E402

SYSTEMS = ("gf-pool", "gf-copy", "ddp")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="subset of " + ",".join(SYSTEMS))
    p.add_argument("--model", default="mlp", choices=("mlp", "resnet"))
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600, help="seconds per process group")
    p.add_argument("--json-out", default=os.path.join(bu.HERE, "results", "train_throughput.json"))
    p.add_argument("--markdown-out", default=None)
    p.add_argument("--docs", default=None,
                   help="markdown file (e.g. docs/performance.md) whose train_throughput section is (re)written "
                        "between markers; other sections are kept")
    a = p.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    systems = [s for s in a.systems.split(",") if s]
    wargs = ["--batch", str(a.batch), "--warmup", str(a.warmup), "--steps", str(a.steps), "--reps", str(a.reps)]
    configs = [("torch", 1)] if 1 in ranks else []
    configs += [(s, n) for n in ranks for s in systems]
    info = bu.machine_info()
    total = len(configs) * a.rounds
    runs = []
    k = 0
    t_start = time.time()
    for rnd in range(a.rounds):
        for system, n in configs:
            k += 1
            print(f"[{k}/{total}] round {rnd + 1}: {system} on {n} rank(s), model {a.model} "
                  f"(load {os.getloadavg()[0]:.2f}, {time.time() - t_start:.0f}s elapsed)", flush=True)
            r = td.run_group([system], a.model, n, "local", wargs, {}, a.timeout)[system]
            r["round"] = rnd
            runs.append(r)
            if "throughput" in r:
                print(f"    -> {r['throughput']:.1f} samples/s (reps {', '.join(f'{v:.1f}' for v in r['samples_per_s'])})",
                      flush=True)
    rows = summarize(runs, configs)
    md = markdown(rows, a, info, ranks)
    print()
    print(md)
    os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
    with open(a.json_out, "w") as f:
        json.dump({"machine": info, "args": {k: bu.portable_path(v) for k, v in vars(a).items()}, "rows": rows, "runs": runs}, f, indent=1)
    print(f"\nJSON: {a.json_out}")
    if a.markdown_out:
        with open(a.markdown_out, "w") as f:
            f.write(md)
    if a.docs:
        cmd = "python benchmarks/train_throughput.py " + " ".join(sys.argv[1:])
        write_section(a.docs, f"Command: `{cmd}`\n\n" + md)
        print(f"docs: {a.docs}")


BEGIN, END = "<!-- train_throughput.py:begin -->", "<!-- train_throughput.py:end -->"


def write_section(path, md):
    """Replace our section between the markers (or append it); keep the rest of the file."""
    bu.write_doc_section(path, BEGIN, END, "## Training step throughput, shared memory "
                         f"(benchmarks/train_throughput.py)\n\n{md}\n")


def summarize(runs, configs):
    rows = []
    for system, n in configs:
        rs = [r for r in runs if r["system"] == system and r["ranks"] == n]
        ok = [r for r in rs if "throughput" in r]
        row = {"system": system, "ranks": n, "rounds_ok": len(ok), "rounds": len(rs)}
        if ok:
            row["throughput"] = statistics.median(r["throughput"] for r in ok)
            row["round_medians"] = [r["throughput"] for r in ok]
            row["all_reps"] = [v for r in ok for v in r["samples_per_s"]]
            row["load"] = [r["loadavg_after"][0] for r in ok]
            st = [r.get("stats") for r in ok if r.get("stats")]
            if st:
                steps = ok[0]["reps"] * ok[0]["steps"]
                row["fusion_bytes_copied_per_step"] = st[0].get("fusion.bytes_copied", 0) / steps
                row["bytes_sent_per_step"] = st[0].get("bytes_sent", 0) / steps
        else:
            row["error"] = rs[0].get("error") if rs else "not run"
            row["output_tail"] = rs[0].get("output_tail", "") if rs else ""
        rows.append(row)
    return rows


def markdown(rows, a, info, ranks):
    by = {(r["system"], r["ranks"]): r for r in rows}

    def tp(s, n):
        r = by.get((s, n))
        if not r:
            return None
        return r.get("throughput")

    out = []
    out.append(f"Model WideMLP 1024-4096-4096-1024-10 ({25.19:.1f} M parameters), batch {a.batch} per rank, "
               f"1 torch thread per rank, shared memory (mpiexec on one 2-core machine); "
               f"median of {a.reps} repetitions x {a.steps} steps per round, median over {a.rounds} round(s), "
               f"{a.warmup} warm-up steps excluded. Date {info['date']}, load average at start "
               f"{info['loadavg'][0]:.2f}.\n")
    base = tp("torch", 1)
    if base:
        out.append(f"Plain torch, 1 process, no library: **{base:.1f} samples/s**.\n")
    hdr = "| ranks | " + " | ".join(s for s in a.systems.split(",")) + " | gf-pool / ddp | gf-copy / ddp | fusion bytes copied per step (pool / copy) | load (1-min, after each round) |"
    out.append(hdr)
    out.append("|" + "---|" * (hdr.count("|") - 1))
    for n in ranks:
        cells = []
        for s in a.systems.split(","):
            r = by.get((s, n), {})
            if "throughput" in r:
                spread = f" ({min(r['round_medians']):.1f}–{max(r['round_medians']):.1f})" if len(r['round_medians']) > 1 else ""
                cells.append(f"{r['throughput']:.1f}{spread}")
            else:
                cells.append(f"FAILED: {r.get('error', 'not run')}")
        ratio = lambda x, y: f"{tp(x, n) / tp(y, n):.2f}" if tp(x, n) and tp(y, n) else "—"  # noqa: E731
        cp = lambda s: by.get((s, n), {}).get("fusion_bytes_copied_per_step")  # noqa: E731
        fmt = lambda v: "—" if v is None else f"{v / 2**20:.1f} MiB"  # noqa: E731
        loads = sorted({round(x, 1) for s in a.systems.split(",") for x in by.get((s, n), {}).get("load", [])})
        out.append(f"| {n} | " + " | ".join(cells) + f" | {ratio('gf-pool', 'ddp')} | {ratio('gf-copy', 'ddp')} | "
                   f"{fmt(cp('gf-pool'))} / {fmt(cp('gf-copy'))} | {min(loads) if loads else '—'}–{max(loads) if loads else '—'} |")
    out.append("\nSamples/s over all ranks; in parentheses the range of the per-round medians.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
