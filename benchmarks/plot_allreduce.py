#!/usr/bin/env python
"""Plot bus bandwidth against message size, one line per system, one panel
per JSON file written by `allreduce_bench.py --json` (the measured data only).

    python benchmarks/plot_allreduce.py benchmarks/results/allreduce_*.json -o docs/allreduce_busbw.png
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402


def title_of(meta: dict) -> str:
    where = "shared memory"
    if meta.get("netns"):
        net = meta.get("network") or {}
        rate = net.get("rate", net.get("HX_RATE", "?"))  # HX_RATE: results of the earlier harness
        where = f"emulated {rate} link"
    return f"{meta['nranks']} ranks, {where}\n{meta['date'][:16]}, load {meta['loadavg'][0]:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--output", default="allreduce_busbw.png")
    args = p.parse_args()
    # shared-memory panels first, then network; fewer ranks first
    data = [json.load(open(f)) for f in args.json]
    data.sort(key=lambda d: (bool(d["meta"].get("netns")), d["meta"]["nranks"]))
    cols = min(2, len(data))
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.4 * rows), squeeze=False)
    styles = {"gradflow-ring": ("C0", "o", "-"), "gradflow-two-sync": ("C1", "s", "-"),
              "gradflow-mpi": ("C2", "^", "-"), "gradflow-ring-numpy": ("C0", "x", ":"),
              "mpi4py": ("k", "D", "--"), "gloo": ("C3", "v", "--")}
    for ax, d in zip(axes.flat, data):
        n = d["meta"]["nranks"]
        for system, m in d["systems"].items():
            pts = [(r["bytes"], bu.busbw(r["bytes"], n, r["median"]) / 1e9) for r in m.get("results", [])]
            if not pts:
                continue
            c, mk, ls = styles.get(system, (None, ".", "-"))
            label = system if system != "mpi4py" else "MPI_Allreduce (mpi4py)"
            label = label if system != "gloo" else "torch gloo"
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=mk, linestyle=ls, color=c, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["bytes"] for m in d["systems"].values() for r in m.get("results", [])})
        ax.set_xticks(ticks)
        ax.set_xticklabels([bu.fmt_size(t).replace(" ", "") for t in ticks], rotation=45, fontsize=8)
        ax.set_xlabel("message size (float32 buffer)")
        ax.set_ylabel("bus bandwidth, GB/s (median)")
        ax.set_title(title_of(d["meta"]), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    fig.suptitle("allreduce(sum) bus bandwidth = 2(N-1)/N x bytes / time, 2-core machine", fontsize=11)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
