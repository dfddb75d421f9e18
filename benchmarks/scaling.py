#!/usr/bin/env python
"""Scaling benchmark on an emulated 1 Gbit/s cluster: gradflow against
PyTorch DDP, speedup ratio and scaling efficiency, table + plots (issue 7).

    sudo python benchmarks/scaling.py --quick          # smoke: < 5 min on an idle 2-core machine
    sudo python benchmarks/scaling.py                  # full: published numbers, ~25-40 min
    python benchmarks/scaling.py --systems gf-fp32,ddp --models mlp --ranks 2,4

Needs root (network namespaces). The script builds its own emulated cluster
with the project's harness (benchmarks/cluster/: MAXN hosts, RATE per NIC,
DELAY one way, namespaces gradflow-scale<pid>-*, so it never touches another
cluster on the machine), runs every configuration with a timeout, and removes
the cluster at the end, also on error and on Ctrl-C / SIGTERM / SIGHUP.
--cluster NAME runs on a cluster that is already up instead (and leaves it).

For N in --ranks, each rank is its own emulated host with its own RATE NIC:
  gradflow systems: N MPI ranks, one per host (MPICH over TCP)
  DDP systems     : one process per host, gloo, env:// (the harness's raw mode)
Systems (--systems; further rows = further names in _trainbench.py):
  gf-fp32     (a) DistributedOptimizer defaults: pool + overlap, dense, fp32 wire
  gf-fp16     (b) same with Compression.fp16 (16-bit wire, fp32 sums)
  gf-csc0.1   (c) same, fp32 wire, CSC sparse_ratio=0.1
  gf-csc0.01  (c) same, fp32 wire, CSC sparse_ratio=0.01
  gf-all      (d) pool + overlap + fp16 wire + CSC 0.01
  ddp         (e) torch DistributedDataParallel, gloo
  ddp-fp16    (f) DDP + default_hooks.fp16_compress_hook
  nocomm      N independent plain-torch processes on N hosts, no gradient
              exchange: what the machine's cores and memory deliver to N
              ranks at best (the measured ceiling; with 2 cores and one
              memory system it is below min(N, cores) x one process)
  nocomm-sync nocomm with a barrier after each backward (only when named):
              what waiting for the slowest rank every step costs alone
  gf-all+fl, nocomm+fl  gf-all and nocomm with FusedLinear layers
              (gradflow.torch.fuse_linear_grad_accumulation: weight gradients
              accumulated in place into .grad; nocomm+fl keeps .grad between
              steps so the fusion applies): the same-layers ceiling
  keras       plain Keras (TF backend), 1 process: the Keras baseline (N=1 only)
  keras-fp32, keras-all (fp16 wire + CSC 0.01), and their -seq twins with
              the TF gradient reduction not overlapped (GRADFLOW_TF_OVERLAP=0):
              benchmarks/_kerasbench.py, the same WideMLP in Keras 3, MPI ranks
CSC runs with GRADFLOW_SPARSE_CHUNK=32768 and GRADFLOW_SPARSE_WARMUP_STEPS=5;
the warm-up steps of every system (which include those 5 dense steps and
the pool build at step 1) are excluded from the timing.
Baseline: plain torch, one process, no library, inside one emulated host.
Speedup = throughput(N) / baseline.  Scaling efficiency =
throughput(N) / (min(N, cores) * baseline): every rank uses one torch thread,
so N ranks have at most min(N, cores) cores of compute (cores = 2 here).
Models: mlp (WideMLP 25.2 M parameters, communication-heavy) and resnet
(small ResNet-style CNN, 0.3 M parameters, compute-heavy), synthetic data.
Outputs: JSON (benchmarks/results/scaling[-quick].json), a markdown section
in docs/performance.md (between markers, replaced on re-run; other sections
kept), docs/scaling_throughput_<model>.png and docs/scaling_bytes_<model>.png;
--quick writes only its JSON and prints the table (the published section and
plots come from full runs; pass --docs/--plots-dir to override).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu  # noqa: E402
import _traindriver as td  # noqa: E402
from cluster import Cluster, ClusterError  # noqa: E402

GF = ["gf-fp32", "gf-fp16", "gf-csc0.1", "gf-csc0.01", "gf-all"]
DDP = ["ddp", "ddp-fp16", "nocomm"]  # torch.distributed family (the cluster's raw mode)
DDP_EXTRA = ["nocomm-sync"]  # the same family, run only when named in --systems
FUSED = ["gf-all+fl", "nocomm+fl"]  # with FusedLinear layers (issue 16 target 1)
KERAS = ["keras-fp32", "keras-fp32-seq", "keras-all", "keras-all-seq"]  # _kerasbench.py, MPI ranks
LABELS = {
    "torch": "plain torch, 1 process (baseline)",
    "gf-fp32": "(a) gradflow dense fp32",
    "gf-fp16": "(b) gradflow fp16 wire",
    "gf-csc0.1": "(c) gradflow CSC 0.1",
    "gf-csc0.01": "(c) gradflow CSC 0.01",
    "gf-all": "(d) gradflow all (pool+overlap+fp16+CSC 0.01)",
    "gf-all+fl": "(d) gradflow all, FusedLinear layers (weight-gradient accumulation fusion)",
    "nocomm+fl": "N plain-torch processes, no communication, FusedLinear layers and persistent .grad",
    "ddp": "(e) DDP gloo",
    "ddp-fp16": "(f) DDP gloo + fp16 hook",
    "nocomm": "N plain-torch processes side by side, no communication (measured compute ceiling)",
    "nocomm-sync": "N plain-torch processes, no communication, a barrier after each backward",
    "gf-pool": "gradflow pool", "gf-copy": "gradflow copy path",
    "keras": "plain Keras (TF backend), 1 process (Keras baseline)",
    "keras-fp32": "Keras + gradflow dense fp32, overlapped",
    "keras-fp32-seq": "Keras + gradflow dense fp32, not overlapped",
    "keras-all": "Keras + gradflow fp16 wire + CSC 0.01, overlapped",
    "keras-all-seq": "Keras + gradflow fp16 wire + CSC 0.01, not overlapped",
}
MODEL_DESC = {"mlp": "WideMLP 1024-4096-4096-1024-10, 25.2 M parameters (communication-heavy)",
              "resnet": "small ResNet-style CNN on 32x32x3, 0.31 M parameters (compute-heavy)"}
BEGIN, END = "<!-- scaling.py:begin -->", "<!-- scaling.py:end -->"


# ------------------------------------------------------------------ main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: model mlp, ranks 2, fewer steps (< 5 min on an idle machine)")
    p.add_argument("--systems", default=",".join(GF + FUSED[:1] + DDP + FUSED[1:]))
    p.add_argument("--models", default=None, help="mlp,resnet (quick: mlp)")
    p.add_argument("--ranks", default=None, help="1,2,4 (quick: 2)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 8, quick 7)")
    p.add_argument("--steps", type=int, default=None, help="steps per repetition (default 3, quick 1)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-mlp", type=int, default=32)
    p.add_argument("--batch-resnet", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900, help="seconds per system in a process group")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="run on this emulated cluster, already up with >= max(--ranks) hosts "
                        "(python -m benchmarks.cluster up N --name NAME), and leave it up")
    p.add_argument("--pool-bucket-mb", type=float, default=None,
                   help="GRADFLOW_POOL_BUCKET_BYTES for the gradflow systems (default: gradflow's)")
    p.add_argument("--pool-first-bucket-mb", type=float, default=None,
                   help="GRADFLOW_POOL_FIRST_BUCKET_BYTES for the gradflow systems (default: gradflow's)")
    p.add_argument("--gf-env", action="append", default=[], metavar="KEY=VALUE",
                   help="a further GRADFLOW_* setting for the gradflow systems (repeatable), "
                        "e.g. --gf-env GRADFLOW_CYCLE_TIME=5")
    p.add_argument("--json-out", default=None)
    p.add_argument("--docs", default=None,
                   help="markdown file whose scaling section is (re)written; '' = none "
                        "(default: docs/performance.md in full mode, none with --quick)")
    p.add_argument("--plots-dir", default=None,
                   help="'' = no plots (default: docs/ in full mode, none with --quick)")
    a = p.parse_args()
    for kv in a.gf_env:
        if not kv.startswith("GRADFLOW_") or "=" not in kv:
            p.error(f"--gf-env {kv!r}: expected GRADFLOW_<KEY>=<value>")
    # A smoke run must not replace the published numbers and plots.
    if a.docs is None:
        a.docs = "" if a.quick else os.path.join(bu.ROOT, "docs", "performance.md")
    if a.plots_dir is None:
        a.plots_dir = "" if a.quick else os.path.join(bu.ROOT, "docs")
    a.models = (a.models or ("mlp" if a.quick else "mlp,resnet")).split(",")
    a.ranks = [int(x) for x in (a.ranks or ("2" if a.quick else "1,2,4")).split(",")]
    a.warmup = a.warmup if a.warmup is not None else (7 if a.quick else 8)
    a.steps = a.steps if a.steps is not None else (1 if a.quick else 3)
    a.systems = [s for s in a.systems.split(",") if s]
    a.json_out = a.json_out or os.path.join(bu.HERE, "results", "scaling-quick.json" if a.quick else "scaling.json")
    return a


def main() -> None:
    a = parse_args()
    cmdline = "python benchmarks/scaling.py " + bu.portable_cmd(sys.argv[1:])
    info = bu.machine_info()
    info["cores"] = os.cpu_count() or 1
    gf = [s for s in a.systems if s.startswith("gf-")]
    ddp = [s for s in a.systems if s.removesuffix("+fl") in DDP + DDP_EXTRA]
    kr = [s for s in a.systems if s in KERAS]
    groups = []  # (model, N, family systems, mode)
    for m in a.models:
        # The baseline is measured before and after the model's other runs
        # (single-process speed drifts by +-20 % on this shared machine);
        # the median of all its repetitions is the baseline (see _baseline).
        groups.append((m, 1, ["torch"], "netns-raw"))
        if "keras" in a.systems:
            groups.append((m, 1, ["keras"], "netns-raw"))
        for n in a.ranks:
            if gf:
                groups.append((m, n, gf, "netns"))
            if ddp:
                groups.append((m, n, ddp, "netns-raw"))
            if kr:
                groups.append((m, n, kr, "netns"))
        groups.append((m, 1, ["torch"], "netns-raw-after"))
    total = sum(len(g[2]) for g in groups)
    results = []
    t_start = time.time()
    status = "complete"
    bu.interrupt_on_signals()
    try:
        if a.cluster:
            cluster = Cluster.attach(a.cluster)
            if cluster.hosts < max(a.ranks):
                raise ClusterError(f"cluster {a.cluster!r} has {cluster.hosts} hosts, {max(a.ranks)} needed")
        else:
            cluster = Cluster(max(a.ranks), a.rate, a.delay, name=f"scale{os.getpid()}")
            print(f"[scaling] building the emulated cluster: {max(a.ranks)} hosts, {a.rate}, delay {a.delay}",
                  flush=True)
            cluster.up()
    except ClusterError as e:
        sys.exit(f"[scaling] {e}")
    try:
        info["network"] = bu.netns_desc(cluster)
        done = 0
        for m, n, systems, mode in groups:
            batch = a.batch_mlp if m == "mlp" else a.batch_resnet
            wargs = ["--batch", str(batch), "--warmup", str(a.warmup), "--steps", str(a.steps),
                     "--reps", str(a.reps)]
            env = {"GRADFLOW_SPARSE_CHUNK": "32768", "GRADFLOW_SPARSE_WARMUP_STEPS": "5"} if mode == "netns" else {}
            if mode == "netns":  # the gradflow (and Keras-over-gradflow) groups
                if a.pool_bucket_mb is not None:
                    env["GRADFLOW_POOL_BUCKET_BYTES"] = str(int(a.pool_bucket_mb * 2**20))
                if a.pool_first_bucket_mb is not None:
                    env["GRADFLOW_POOL_FIRST_BUCKET_BYTES"] = str(int(a.pool_first_bucket_mb * 2**20))
                env.update(kv.split("=", 1) for kv in a.gf_env)
            print(f"[{done + 1}-{done + len(systems)}/{total}] model {m}, N={n}: {', '.join(systems)} "
                  f"(load {os.getloadavg()[0]:.2f}, {time.time() - t_start:.0f}s elapsed, "
                  f"{total - done} configuration(s) left)", flush=True)
            after = mode.endswith("-after")
            res = td.run_group(systems, m, n, mode[:-len("-after")] if after else mode, wargs, env,
                               a.timeout, cluster=cluster)
            for s in systems:
                r = res[s]
                if after:
                    r["system"] = s = "torch-after"
                results.append(r)
                if "throughput" in r:
                    print(f"    {s:11s} N={n}: {r['throughput']:8.1f} samples/s  "
                          f"(reps {', '.join(f'{v:.1f}' for v in r['samples_per_s'])})", flush=True)
            done += len(systems)
            bu.save_sweep_json(a, info, cmdline, "partial", results=results)
    except KeyboardInterrupt as e:
        status = f"interrupted ({e})"
        print(f"[scaling] {status}; cleaning up", flush=True)
    finally:
        cluster.down()  # only what we built (not a --cluster one)
    info["wall_seconds"] = time.time() - t_start
    bu.save_sweep_json(a, info, cmdline, status, results=results)
    md = report(a, info, cmdline, results, status)
    print()
    print(md)
    if a.plots_dir and results:
        for path in plots(a, results):
            print(f"plot: {path}")
    if a.docs and status == "complete":
        write_section(a.docs, md)
        print(f"docs: {a.docs} (section between {BEGIN} and {END})")
    if status != "complete":
        sys.exit(130)


# ------------------------------------------------------------------ report

def _index(results):
    return {(r["model"], r["system"], r["ranks"]): r for r in results}


def _baseline(idx, m):
    """Median of the repetitions of both plain-torch runs of model m."""
    reps = [v for s in ("torch", "torch-after")
            for v in idx.get((m, s, 1), {}).get("samples_per_s", [])]
    return statistics.median(reps) if reps else None


def report(a, info, cmdline, results, status):
    idx = _index(results)
    cores = info["cores"]
    L = []
    L.append(f"Date {info['date']}; machine: {cores} cores ({info['platform']}), no GPU; "
             f"{info.get('network', '')}; rate {a.rate}, added one-way delay {a.delay}; "
             f"1 torch thread per rank; mode: {'--quick' if a.quick else 'full'}; run {status}; "
             f"load average at start {info['loadavg'][0]:.2f}, wall time {info.get('wall_seconds', 0) / 60:.1f} min.\n")
    L.append(f"Command: `sudo {cmdline}`\n")
    L.append(f"Per configuration: {a.warmup} warm-up steps (not timed; include step 1 on the copy path, the pool "
             f"build and the 5 dense CSC warm-up steps), then {a.reps} repetitions x {a.steps} step(s); "
             f"throughput = median over repetitions (samples/s over all ranks; slowest rank's time). "
             f"Speedup = throughput(N) / plain-torch 1-process throughput; efficiency = throughput(N) / "
             f"(min(N, {cores}) x plain-torch 1-process throughput) — ceiling = min(N, {cores} cores) x one "
             f"process, i.e. 2x at N = 4, not 4x.\n")
    for m in a.models:
        base = _baseline(idx, m)
        batch = a.batch_mlp if m == "mlp" else a.batch_resnet
        L.append(f"#### Model {m}: {MODEL_DESC[m]}, batch {batch} per rank\n")
        reps = {s: idx.get((m, s, 1), {}).get("samples_per_s", []) for s in ("torch", "torch-after")}
        L.append(f"Baseline (plain torch, 1 process, no library): "
                 f"{'%.1f samples/s' % base if base else 'FAILED'} (median of the repetitions "
                 f"measured before the other runs: {', '.join('%.1f' % v for v in reps['torch'])}; "
                 f"and after: {', '.join('%.1f' % v for v in reps['torch-after'])})\n")
        hdr = "| system | " + " | ".join(f"N={n} samples/s | speedup | eff." for n in a.ranks) + \
              " | " + " | ".join(f"MiB sent/step/rank N={n} (gradflow stats / NIC)" for n in a.ranks if n > 1) + " |"
        L.append(hdr)
        L.append("|" + "---|" * (hdr.count("|") - 1))
        for s in a.systems:
            cells = []
            for n in a.ranks:
                r = idx.get((m, s, n), {})
                if "throughput" in r:
                    t = r["throughput"]
                    cells += [f"{t:.1f}", f"{t / base:.2f}" if base else "—",
                              f"{t / (min(n, cores) * base):.2f}" if base else "—"]
                elif s == "keras" and n > 1:
                    cells += ["—", "", ""]  # one-process baseline
                else:
                    cells += [f"FAILED ({r.get('error', 'not run')})", "", ""]
            for n in a.ranks:
                if n == 1:
                    continue
                r = idx.get((m, s, n), {})
                b = r.get("bytes_sent_per_step")
                nic = r.get("nic_tx_bytes_per_step")
                cells.append(f"{'—' if b is None else '%.2f' % (b / 2**20)} / "
                             f"{'—' if nic is None else '%.2f' % (nic / 2**20)}")
            L.append(f"| {LABELS.get(s, s)} | " + " | ".join(cells) + " |")
        L.append("")
        L.extend(verdicts(a, idx, m, base, cores))
    L.append("Loads (1-min average after each process group): " +
             ", ".join(f"{r['model']}/{r['system']}/N={r['ranks']}: {r['loadavg_after'][0]:.1f}"
                       for r in results if r.get("loadavg_after") and r["system"] in ("torch", "torch-after", a.systems[0], "ddp")) + "\n")
    fails = [r for r in results if "throughput" not in r]
    if fails:
        L.append("Failures:\n")
        for r in fails:
            L.append(f"- {r['model']} {r['system']} N={r['ranks']}: {r.get('error')}; command `{r.get('command')}`")
            tail = "\n".join(r.get("output_tail", "").splitlines()[-8:])
            if tail:
                L.append("  ```\n" + "\n".join("  " + ln for ln in tail.splitlines()) + "\n  ```")
        L.append("")
    return "\n".join(L) + "\n"


def verdicts(a, idx, m, base, cores):
    """Issue 7 targets, computed from the measured rows (comm-heavy model only)."""
    if m != "mlp":
        return []
    out = ["Issue 7 targets (communication-heavy model):\n"]

    def tp(s, n):
        return idx.get((m, s, n), {}).get("throughput")

    for n in [n for n in a.ranks if n > 1]:
        allr, ddp, ddp16, dense = tp("gf-all", n), tp("ddp", n), tp("ddp-fp16", n), tp("gf-fp32", n)

        def chk(ok):
            return "**met**" if ok else "**missed**"
        if allr and ddp16:
            out.append(f"- N={n}: gradflow all / DDP+fp16 hook = {allr / ddp16:.2f} (target ≥ 1.5): {chk(allr / ddp16 >= 1.5)}")
        if allr and ddp:
            out.append(f"- N={n}: gradflow all / plain DDP = {allr / ddp:.2f} (target ≥ 2): {chk(allr / ddp >= 2)}")
        if allr and base and ddp:
            e_all, e_ddp = allr / (min(n, cores) * base), ddp / (min(n, cores) * base)
            out.append(f"- N={n}: efficiency gradflow all {e_all:.2f} (target ≥ 0.8) vs DDP {e_ddp:.2f} "
                       f"(issue's premise: < 0.25): {chk(e_all >= 0.8)}")
        ceil = tp("nocomm", n)
        if allr and ceil:
            out.append(f"- N={n}: measured ceiling (N processes, no communication) {ceil:.1f} samples/s = "
                       f"{ceil / (min(n, cores) * base):.2f} x min(N, cores) x baseline; gradflow all reaches "
                       f"{allr / ceil:.2f} of it, DDP {ddp / ceil:.2f}" if base and ddp else
                       f"- N={n}: measured ceiling {ceil:.1f} samples/s")
        all_fl, ceil_fl = tp("gf-all+fl", n), tp("nocomm+fl", n)
        if all_fl and ceil and ceil_fl:  # issue 16 target 1 with FusedLinear layers
            out.append(f"- N={n}: with FusedLinear (+fl): gradflow all {all_fl:.1f} = {all_fl / ceil:.2f} of "
                       f"nocomm, {all_fl / ceil_fl:.2f} of nocomm+fl ({ceil_fl:.1f}: the same layers, "
                       f"persistent .grad)")
        if dense and ddp:
            out.append(f"- N={n}: gradflow dense fp32 / DDP = {dense / ddp:.2f} (target ≥ 0.95): {chk(dense / ddp >= 0.95)}")
    out.append("")
    return out


def write_section(path, md):
    resnet_plot = os.path.exists(os.path.join(os.path.dirname(path), "scaling_throughput_resnet.png"))
    bu.write_doc_section(
        path, BEGIN, END,
        f"## Training scaling on an emulated 1 Gbit/s cluster (benchmarks/scaling.py)\n\n"
        f"{md}\n![throughput vs N, mlp](scaling_throughput_mlp.png)\n"
        f"![bytes per step, mlp](scaling_bytes_mlp.png)\n"
        + ("![throughput vs N, resnet](scaling_throughput_resnet.png)\n" if resnet_plot else ""))


def plots(a, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    idx = _index(results)
    paths = []
    cores = os.cpu_count() or 1
    for m in a.models:
        base = _baseline(idx, m)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s in a.systems:
            ns = [n for n in a.ranks if "throughput" in idx.get((m, s, n), {})]
            if ns:
                kw = dict(color="black", linestyle="-.") if s == "nocomm" else \
                    dict(color="gray", linestyle="-.") if s == "nocomm+fl" else \
                    dict(linestyle="--" if s.startswith("ddp") else "-")
                label = "N processes, no communication (measured ceiling)" if s == "nocomm" \
                    else LABELS.get(s, s)
                ax.plot(ns, [idx[(m, s, n)]["throughput"] for n in ns], marker="o", label=label, **kw)
        if base:
            ax.plot(a.ranks, [min(n, cores) * base for n in a.ranks], color="gray", linestyle=":",
                    label=f"compute ceiling min(N,{cores}) x 1 process")
            ax.axhline(base, color="black", linewidth=0.8, label="plain torch, 1 process")
        ax.set_xticks(a.ranks)
        ax.set_xlabel("ranks N (one emulated host each, %s link)" % a.rate)
        ax.set_ylabel("samples/s (all ranks)")
        ax.set_title(f"Training throughput vs N — {m}")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(a.plots_dir, f"scaling_throughput_{m}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits below the axes
        plt.close(fig)
        paths.append(path)
        if m != "mlp":
            continue
        ns = [n for n in a.ranks if n > 1]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.8 / max(1, len(ns))
        syss = [s for s in a.systems if not s.startswith("nocomm")]  # sends nothing
        for j, n in enumerate(ns):
            gfb = [idx.get((m, s, n), {}).get("bytes_sent_per_step") for s in syss]
            nic = [idx.get((m, s, n), {}).get("nic_tx_bytes_per_step") for s in syss]
            xs = [i + j * width for i in range(len(syss))]
            ax.bar(xs, [(b or 0) / 2**20 for b in gfb], width * 0.9, label=f"N={n}: gradflow.stats bytes_sent")
            ax.scatter(xs, [(b or 0) / 2**20 for b in nic], marker="_", s=200, color="black", zorder=3,
                       label="NIC tx bytes (all systems, incl. headers)" if j == 0 else None)
        ax.set_xticks([i + width * (len(ns) - 1) / 2 for i in range(len(syss))])
        ax.set_xticklabels([s for s in syss], rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel("MiB sent per step per rank (log)")
        ax.set_title(f"Bytes on the wire per step — {m}")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        path = os.path.join(a.plots_dir, f"scaling_bytes_{m}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
