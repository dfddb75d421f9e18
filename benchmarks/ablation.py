#!/usr/bin/env python
"""Ablation in the GradientFlow paper's order (issue 16, target 8): what each
technique adds, one on top of the other, on an AlexNet-shaped model over an
emulated 1 Gbit/s and 10 Gbit/s cluster.

    sudo python benchmarks/ablation.py --quick     # smoke: 1 Gbit/s, N=2, 2 repetitions (~3 min)
    sudo python benchmarks/ablation.py             # full: 1 and 10 Gbit/s, N = 1, 2, 4 (~15-20 min)

Rows (each adds one thing to the row above; gradflow rows force the ring,
GRADFLOW_ALLREDUCE_ALGO=ring, as in the paper):
  ddp                DDP (gloo): the baseline
  gf-copy-nooverlap  gradflow ring, no overlap: DistributedOptimizer(use_pool=False,
                     overlap=False), every gradient submitted by step() after backward
  gf-copy            + overlap: each gradient submitted from its hook during backward
                     (per tensor; the core fuses what is queued together)
  gf-pool            + lazy allreduce: the gradient pool, buckets reduced in place
  gf-fp16            + fp16 wire (16-bit on the wire, fp32 sums)
  gf-all             + CSC, sparse_ratio 0.01
  nocomm             N plain-torch processes side by side, no gradient exchange:
                     the measured compute ceiling of N ranks on this machine
Model: AlexNet64 in _trainbench.py (5 convolutions, two 4096-wide fully
connected layers, classifier; synthetic 64x64x3 input, 10 classes).

Per (rate, N) the gradflow rows run in one process group and the DDP/nocomm
rows in the next, back to back (so every ratio in a column comes from the
same run). N=1 sends nothing (gradflow's one-rank path is plain torch; DDP's
gloo stays in the process), so it is measured once, on the first rate's
cluster, and shown for both rates. The emulated cluster (benchmarks/cluster,
namespaces gradflow-abl<pid>r<rate>-*) is built per rate and removed
afterwards, also on error and on Ctrl-C / SIGTERM / SIGHUP.

--from-json PATH rewrites the table, section and plot from an earlier JSON.
Outputs: benchmarks/results/ablation-<date>.json (every repetition), a
markdown section in docs/performance.md between its markers, and
docs/ablation.png. --quick writes only its JSON (ablation-quick.json) and
prints the table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402
import _traindriver as td  # noqa: E402
from _trainbench import n_params  # noqa: E402
from cluster import Cluster, ClusterError  # noqa: E402

MODEL = "alexnet"
STEPS = [  # (system in _trainbench.py, row label), in the paper's order
    ("ddp", "DDP (gloo)"),
    ("gf-copy-nooverlap", "gradflow ring, no overlap (copy path, submitted at step())"),
    ("gf-copy", "+ overlap (per-tensor submit during backward)"),
    ("gf-pool", "+ lazy allreduce (gradient pool)"),
    ("gf-fp16", "+ fp16 wire"),
    ("gf-all", "+ CSC sparse_ratio 0.01"),
]
CEILING = ("nocomm", "no communication (N processes side by side: measured ceiling)")
GF_ROWS = [s for s, _ in STEPS if s.startswith("gf-")]
DDP_ROWS = ["ddp", "nocomm"]
GF_ENV = {"GRADFLOW_ALLREDUCE_ALGO": "ring", "GRADFLOW_SPARSE_CHUNK": "32768",
          "GRADFLOW_SPARSE_WARMUP_STEPS": "2"}
BEGIN, END = "<!-- ablation.py:begin -->", "<!-- ablation.py:end -->"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 1gbit, N=2, 2 repetitions")
    p.add_argument("--rates", default=None, help="comma list of tc rates (default 1gbit,10gbit; quick 1gbit)")
    p.add_argument("--ranks", default=None, help="comma list (default 1,2,4; quick 2)")
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps: step 1 (copy path, then the pool build), step 2 (the second dense "
                        "CSC warm-up step) and the first sparse step")
    p.add_argument("--steps", type=int, default=1, help="steps per repetition")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 4, quick 2)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per system in a process group")
    p.add_argument("--json-out", default=None)
    p.add_argument("--docs", default=None, help="markdown file for the section ('' = none; default "
                                                "docs/performance.md, none with --quick)")
    p.add_argument("--plot", default=None, help="png path ('' = none; default docs/ablation.png, none with --quick)")
    p.add_argument("--from-json", default=None, metavar="PATH",
                   help="measure nothing: rewrite the table, section and plot from this earlier result file")
    a = p.parse_args(argv)
    a.rates = (a.rates or ("1gbit" if a.quick else "1gbit,10gbit")).split(",")
    a.ranks = [int(x) for x in (a.ranks or ("2" if a.quick else "1,2,4")).split(",")]
    a.reps = a.reps or (2 if a.quick else 4)
    day = datetime.date.today().isoformat()
    a.json_out = a.json_out or os.path.join(bu.HERE, "results",
                                            "ablation-quick.json" if a.quick else f"ablation-{day}.json")
    if a.docs is None:
        a.docs = "" if a.quick else os.path.join(bu.ROOT, "docs", "performance.md")
    if a.plot is None:
        a.plot = "" if a.quick else os.path.join(bu.ROOT, "docs", "ablation.png")
    return a


# ------------------------------------------------------------------ measuring

def run(a) -> tuple:
    """Measure every (rate, N, system); returns (results, info, status)."""
    info = bu.machine_info()
    info["params"] = n_params(MODEL)
    info["networks"] = {}
    results = []
    status = "complete"
    wargs = ["--batch", str(a.batch), "--warmup", str(a.warmup), "--steps", str(a.steps),
             "--reps", str(a.reps)]
    t0 = time.time()
    bu.interrupt_on_signals()
    print(f"[ablation] model {MODEL}: {info['params']:,} parameters "
          f"({info['params'] * 4 / 2**20:.1f} MiB of fp32 gradients per step)", flush=True)
    try:
        for ri, rate in enumerate(a.rates):
            cluster = Cluster(max(a.ranks), rate, "0", name=f"abl{os.getpid()}r{ri}")
            print(f"[ablation] building the emulated cluster: {max(a.ranks)} hosts, {rate}", flush=True)
            try:
                cluster.up()
            except ClusterError as e:
                sys.exit(f"[ablation] {e}")
            try:
                info["networks"][rate] = bu.netns_desc(cluster)
                for n in a.ranks:
                    if n == 1 and ri > 0:
                        continue  # one rank sends nothing: measured once
                    for systems, mode, env in ((GF_ROWS, "netns", GF_ENV), (DDP_ROWS, "netns-raw", {})):
                        print(f"[ablation] {rate} N={n}: {', '.join(systems)} (load {os.getloadavg()[0]:.2f}, "
                              f"{time.time() - t0:.0f}s elapsed)", flush=True)
                        res = td.run_group(systems, MODEL, n, mode, wargs, env, a.timeout, cluster=cluster)
                        for s in systems:
                            r = dict(res[s], rate=rate if n > 1 else "none (N=1)")
                            results.append(r)
                            if "throughput" in r:
                                print(f"    {s:18s} N={n}: {r['throughput']:7.2f} samples/s (reps "
                                      f"{', '.join('%.2f' % v for v in r['samples_per_s'])})", flush=True)
                        save(a, info, results, "partial")
            finally:
                cluster.down()
    except KeyboardInterrupt as e:
        status = f"interrupted ({e})"
        print(f"[ablation] {status}", flush=True)
    info["wall_seconds"] = time.time() - t0
    info["commit"] = bu.git_commit()
    info["loadavg_end"] = list(os.getloadavg())
    return results, info, status


def save(a, info, results, status):
    os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
    with open(a.json_out, "w") as f:
        json.dump({"machine": info, "commit": bu.git_commit(), "status": status,
                   "command": "python benchmarks/ablation.py " + bu.portable_cmd(sys.argv[1:]),
                   "args": {k: bu.portable_path(v) for k, v in vars(a).items()}, "results": results},
                  f, indent=1)


# ------------------------------------------------------------------ report

def lookup(results, system, n, rate):
    """The result of (system, N) at `rate` (N=1: the one rate-free run)."""
    for r in results:
        if r["system"] == system and r["ranks"] == n and (n == 1 or r["rate"] == rate):
            return r
    return {}


def columns(a):
    """(label, N, rate) per table column; N=1 once (no network)."""
    cols = [("N=1 (no network)", 1, None)] if 1 in a.ranks else []
    cols += [(f"{rate} N={n}", n, rate) for rate in a.rates for n in a.ranks if n > 1]
    return cols


def report(a, info, results, status, cmdline) -> str:
    loads = [info["loadavg"][0], info.get("loadavg_end", [0])[0]] + \
        [r["loadavg_after"][0] for r in results if r.get("loadavg_after")]
    busy = max(loads) > info["cpus"]
    L = [f"Date {info['date']}; {info['cpus']} cores ({info['platform']}), no GPU; 1-min load average "
         f"{loads[0]:.2f} at start, {loads[1]:.2f} at the end, {min(loads):.1f}-{max(loads):.1f} over the run"
         + (" (**more runnable processes than cores: the machine was shared**)" if busy else "")
         + f"; run {status}, {info.get('wall_seconds', 0) / 60:.1f} min; commit {info.get('commit', '?')}.\n",
         f"Command: `sudo {cmdline}`\n",
         f"Model `alexnet` (AlexNet64 in benchmarks/_trainbench.py: 5 convolutions, two 4096-wide fully "
         f"connected layers, classifier; synthetic 64x64x3, 10 classes): {info['params']:,} parameters, "
         f"{info['params'] * 4 / 2**20:.1f} MiB of fp32 gradients per step. Batch {a.batch} per rank, "
         f"1 torch thread per rank, one rank per emulated host. {a.warmup} warm-up steps (not timed), then "
         f"{a.reps} repetitions x {a.steps} step(s); cell = median samples/s over repetitions (all ranks; "
         f"slowest rank's time), then (throughput / DDP's, throughput / no-communication ceiling's) of the "
         f"same column. gradflow rows: GRADFLOW_ALLREDUCE_ALGO=ring, CSC chunk 32768, 2 dense CSC warm-up "
         f"steps. At N=1 gradflow's one-rank path is plain torch (nothing sent), so its rows agree there by "
         f"construction. Networks: " + "; ".join(f"{k}: {v}" for k, v in info["networks"].items()) + ".\n"]
    cols = columns(a)
    L.append("| step | " + " | ".join(c[0] for c in cols) + " |")
    L.append("|---|" + "---|" * len(cols))
    for s, label in STEPS + [CEILING]:
        cells = []
        for _, n, rate in cols:
            r = lookup(results, s, n, rate)
            if "throughput" not in r:
                cells.append(f"FAILED ({r.get('error', 'not run')})")
                continue
            t = r["throughput"]
            ddp = lookup(results, "ddp", n, rate).get("throughput")
            ceil = lookup(results, "nocomm", n, rate).get("throughput")
            ratios = ", ".join(x for x in (f"{t / ddp:.2f}x DDP" if ddp and s != "ddp" else "",
                                           f"{t / ceil:.2f} of ceiling" if ceil and s != "nocomm" else "") if x)
            cells.append(f"{t:.2f}" + (f" ({ratios})" if ratios else ""))
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    L.append("")
    if busy:
        L.append("Caution: with more runnable processes than cores, N ranks get a larger share of the "
                 "machine than one process (the scheduler shares cores per process), and each process "
                 "group met a different load; a row can then beat the no-communication 'ceiling' "
                 "measured in the next group, and the ratios mostly measure the load. The bytes per "
                 "step below do not depend on the load.\n")
    L.append("Raw repetitions (samples/s), load average after each process group, MiB sent per step per rank "
             "(gradflow.stats / NIC tx):\n")
    for _, n, rate in cols:
        parts = []
        for s, _ in STEPS + [CEILING]:
            r = lookup(results, s, n, rate)
            if "samples_per_s" in r:
                b, nic = r.get("bytes_sent_per_step"), r.get("nic_tx_bytes_per_step")
                sent = f", {b / 2**20:.1f}/{nic / 2**20:.1f} MiB" if b is not None and nic is not None else (
                    f", NIC {nic / 2**20:.1f} MiB" if nic is not None else "")
                parts.append(f"{s} [{', '.join('%.2f' % v for v in r['samples_per_s'])}]{sent}")
        load = next((lookup(results, s, n, rate).get("loadavg_after") for s in ("gf-pool", "ddp")), None)
        where = f"{rate} N={n}" if rate else "N=1 (no network)"
        L.append(f"- {where} (load {load[0]:.1f}): " if load else f"- {where}: ")
        L[-1] += "; ".join(parts)
    fails = [r for r in results if "throughput" not in r]
    for r in fails:
        L.append(f"- FAILED {r['system']} N={r['ranks']} {r.get('rate')}: {r.get('error')}; `{r.get('command')}`")
    L.append("")
    return "\n".join(L) + "\n"


def plot(a, results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(a.rates), figsize=(6 * len(a.rates), 4.5), squeeze=False)
    rows = [s for s, _ in STEPS]
    for ax, rate in zip(axes[0], a.rates):
        width = 0.8 / len(a.ranks)
        for j, n in enumerate(a.ranks):
            xs = [i + j * width for i in range(len(rows))]
            ys = [lookup(results, s, n, rate).get("throughput", 0) for s in rows]
            bars = ax.bar(xs, ys, width * 0.9, label=f"N={n}")
            ceil = lookup(results, "nocomm", n, rate).get("throughput")
            if ceil:
                ax.axhline(ceil, linestyle="--", linewidth=0.9, color=bars[0].get_facecolor(),
                           label=f"N={n} no-communication ceiling")
        ax.set_xticks([i + width * (len(a.ranks) - 1) / 2 for i in range(len(rows))])
        ax.set_xticklabels(["DDP", "ring\nno overlap", "+overlap", "+pool", "+fp16", "+CSC 0.01"], fontsize=8)
        ax.set_ylabel("samples/s (all ranks)")
        ax.set_title(f"AlexNet64 ablation, {rate} (N=1: no network)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits below the axes
    plt.close(fig)


def main(argv=None) -> None:
    a = parse_args(argv)
    cmdline = "python benchmarks/ablation.py " + bu.portable_cmd(sys.argv[1:] if argv is None else argv)
    if a.from_json:
        with open(a.from_json) as f:
            rec = json.load(f)
        results, info, status = rec["results"], rec["machine"], rec["status"]
        info.setdefault("commit", rec.get("commit", "?"))
        cmdline = rec["command"]
        for k in ("rates", "ranks", "batch", "warmup", "steps", "reps"):
            setattr(a, k, rec["args"][k])
    else:
        results, info, status = run(a)
        save(a, info, results, status)
    md = report(a, info, results, status, cmdline)
    print()
    print(md)
    print(f"json: {a.json_out}")
    if a.plot and results:
        plot(a, results, a.plot)
        print(f"plot: {a.plot}")
    if a.docs and status == "complete":
        bu.write_doc_section(a.docs, BEGIN, END,
                             "## Ablation in the GradientFlow paper's order, AlexNet-shaped model "
                             "(benchmarks/ablation.py)\n\n" + md + "\n![ablation](ablation.png)\n")
        print(f"docs: {a.docs} (section between {BEGIN} and {END})")
    if status != "complete":
        sys.exit(130)


if __name__ == "__main__":
    main()
