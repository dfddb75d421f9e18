#!/usr/bin/env python
"""Pool bucket-size sweep on an emulated 1 Gbit/s cluster (issue 16 target 5):
training throughput of the MLP with gradient-pool buckets of 1..64 MiB, with
adjacent ready buckets merged into one collective (GRADFLOW_POOL_MERGE=1) and
not (=0), against per-tensor reduction (no pool: the copy path with fusion
off, GRADFLOW_FUSION_THRESHOLD=0), with and without added one-way link delay.

    sudo python benchmarks/bucket_sweep.py --quick     # smoke: 2 sizes, 1 round (~4 min)
    sudo python benchmarks/bucket_sweep.py             # published: ~18 min at load ~15 on 2 cores

Needs root (network namespaces): one emulated cluster per delay
(benchmarks/cluster, namespaces gradflow-bsweep<pid>d<k>-*), both removed at
the end, also on error and Ctrl-C. Per (delay, merge) one process group runs
every bucket size as a system "gf-fp32@b<MiB>" (benchmarks/_trainbench.py);
the per-tensor baseline is a process group of its own. Groups are
interleaved: each round runs every (delay, merge / baseline) group once, and
a configuration's throughput is the median over all its repetitions of all
rounds, so on-vs-off ratios come from the same run, measured side by side.
Writes benchmarks/results/bucket_sweep[-quick].json and (full runs) the
section between the markers below in docs/performance.md.
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

BEGIN, END = "<!-- bucket_sweep.py:begin -->", "<!-- bucket_sweep.py:end -->"
PER_TENSOR = "per-tensor"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="buckets 1,64 MiB, 1 round, N=2, fp32 only")
    p.add_argument("--buckets", default=None, help="MiB list (default 1,2,4,8,16,32,64)")
    p.add_argument("--systems", default=None, help="gf-fp32,gf-fp16 (default gf-fp32)")
    p.add_argument("--ranks", default="2", help="comma list of N (default 2)")
    p.add_argument("--delays", default="0,500us", help="one-way added delay per cluster (tc syntax)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps per system (step 1: copy path; step 2: pool build)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--reps", type=int, default=1, help="timed repetitions per system and round")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--timeout", type=float, default=300, help="seconds per system")
    p.add_argument("--json-out", default=None)
    p.add_argument("--docs", default=None, help="markdown file for the section ('' = none; "
                                                "default docs/performance.md, none with --quick)")
    a = p.parse_args()
    a.buckets = [float(x) for x in (a.buckets or ("1,64" if a.quick else "1,2,4,8,16,32,64")).split(",")]
    a.systems = (a.systems or "gf-fp32").split(",")
    a.ranks = [int(x) for x in a.ranks.split(",")]
    a.delays = a.delays.split(",")
    a.rounds = a.rounds or (1 if a.quick else 2)
    if a.docs is None:
        a.docs = "" if a.quick else os.path.join(bu.ROOT, "docs", "performance.md")
    a.json_out = a.json_out or os.path.join(bu.HERE, "results",
                                            "bucket_sweep-quick.json" if a.quick else "bucket_sweep.json")
    return a


def _mib(b: float) -> str:
    return f"{b:g}"


def groups_of(a):
    """(delay index, N, system, merge, [worker systems], env) of one round."""
    out = []
    for d in range(len(a.delays)):
        for n in a.ranks:
            for s in a.systems:
                for merge in ("1", "0"):
                    out.append((d, n, s, merge, [f"{s}@b{_mib(b)}" for b in a.buckets],
                                {"GRADFLOW_POOL_MERGE": merge}))
                # per tensor: no pool, nothing fused (one collective per gradient)
                copy = "gf-copy" if s == "gf-fp32" else None
                if copy:
                    out.append((d, n, s, PER_TENSOR, [copy], {"GRADFLOW_FUSION_THRESHOLD": "0"}))
    return out


def main() -> None:
    a = parse_args()
    cmdline = "python benchmarks/bucket_sweep.py " + bu.portable_cmd(sys.argv[1:])
    info = bu.machine_info()
    bu.interrupt_on_signals()
    clusters = []
    status = "complete"
    runs = []  # one record per (round, group, worker system)
    t0 = time.time()
    try:
        for k, delay in enumerate(a.delays):
            c = Cluster(max(a.ranks), a.rate, delay, name=f"bsweep{os.getpid()}d{k}")
            print(f"[bucket_sweep] cluster {k}: {max(a.ranks)} hosts, {a.rate}, delay {delay}", flush=True)
            c.up()
            clusters.append(c)
        info["network"] = [bu.netns_desc(c) for c in clusters]
        plan = groups_of(a)
        for rnd in range(a.rounds):
            for i, (d, n, s, merge, systems, env) in enumerate(plan):
                print(f"[round {rnd + 1}/{a.rounds}, group {i + 1}/{len(plan)}] delay {a.delays[d]}, N={n}, "
                      f"{s}, merge={merge}: {len(systems)} system(s) (load {os.getloadavg()[0]:.2f}, "
                      f"{time.time() - t0:.0f}s elapsed)", flush=True)
                wargs = ["--batch", str(a.batch), "--warmup", str(a.warmup), "--steps", str(a.steps),
                         "--reps", str(a.reps)]
                res = td.run_group(systems, "mlp", n, "netns", wargs, env, a.timeout, cluster=clusters[d])
                for w in systems:
                    r = res[w]
                    bucket = None if merge == PER_TENSOR else float(w.partition("@b")[2])
                    st = r.get("stats", {})
                    runs.append({"round": rnd, "delay": a.delays[d], "ranks": n, "system": s,
                                 "merge": merge, "bucket_mib": bucket,
                                 "samples_per_s": r.get("samples_per_s", []), "error": r.get("error"),
                                 "loadavg_after": r.get("loadavg_after"),
                                 "pool_collectives": st.get("pool.collectives"),
                                 "pool_buckets": st.get("pool.buckets"),
                                 "merged_collectives": st.get("pool.merged_collectives", 0),
                                 "allreduce_count": st.get("allreduce.count"),
                                 "timed_steps": a.reps * a.steps, "command": r.get("command")})
                    tp = r.get("samples_per_s")
                    print(f"    {w:18s} {'FAILED ' + str(r.get('error')) if not tp else ', '.join(f'{v:.1f}' for v in tp)}",
                          flush=True)
                bu.save_sweep_json(a, info, cmdline, "partial", runs=runs)
    except (KeyboardInterrupt, ClusterError) as e:
        status = f"interrupted ({e})"
        print(f"[bucket_sweep] {status}; cleaning up", flush=True)
    finally:
        for c in clusters:
            c.down()
    info["wall_seconds"] = time.time() - t0
    bu.save_sweep_json(a, info, cmdline, status, runs=runs)
    md = report(a, info, cmdline, runs, status)
    print()
    print(md)
    if a.docs and status == "complete":
        bu.write_doc_section(a.docs, BEGIN, END,
                             "## Pool bucket-size sweep, merged vs separate bucket collectives "
                             "(benchmarks/bucket_sweep.py)\n\n" + md)
        print(f"docs: {a.docs}")
    if status != "complete":
        sys.exit(130)


def _cell(runs):
    reps = [v for r in runs for v in r["samples_per_s"]]
    return (statistics.median(reps), reps) if reps else (None, [])


def _fmt(m, reps):
    return "FAILED" if m is None else f"{m:.1f} [{', '.join(f'{v:.1f}' for v in reps)}]"


def report(a, info, cmdline, runs, status):
    L = [f"Date {info['date']}; {os.cpu_count()} cores, no GPU; 1-minute load average at start "
         f"{info['loadavg'][0]:.2f} (the table's last column: after each group), wall time "
         f"{info.get('wall_seconds', 0) / 60:.1f} min; run {status}.\n",
         f"Command: `sudo {cmdline}`\n",
         f"Model: WideMLP 1024-4096-4096-1024-10 (25.2 M parameters), batch {a.batch} per rank, link "
         f"{a.rate}. Per system and round: {a.warmup} untimed steps, then {a.reps} x {a.steps} timed "
         f"step(s); {a.rounds} interleaved round(s); cell = median samples/s over all timed repetitions "
         f"(raw values in brackets). merge on/off = GRADFLOW_POOL_MERGE=1/0; per tensor = no pool, "
         f"fusion off (one collective per gradient). buckets/coll. = pool buckets per pool collective "
         f"in the timed steps (merge on).\n"]
    for delay in a.delays:
        for n in a.ranks:
            for s in a.systems:
                sel = [r for r in runs if r["delay"] == delay and r["ranks"] == n and r["system"] == s]
                if not sel:
                    continue
                L.append(f"#### {s}, N={n}, added one-way delay {delay}\n")
                base, base_reps = _cell([r for r in sel if r["merge"] == PER_TENSOR])
                if base is not None:
                    L.append(f"Per tensor (baseline): {base:.1f} samples/s "
                             f"[{', '.join(f'{v:.1f}' for v in base_reps)}]\n")
                L.append("| bucket MiB | merge on | merge off | on / off | on / per tensor | "
                         "buckets/coll. (on) | load after (on, off) |")
                L.append("|---|---|---|---|---|---|---|")
                for b in a.buckets:
                    on = [r for r in sel if r["bucket_mib"] == b and r["merge"] == "1"]
                    off = [r for r in sel if r["bucket_mib"] == b and r["merge"] == "0"]
                    (m_on, r_on), (m_off, r_off) = _cell(on), _cell(off)
                    pc = sum(r["pool_collectives"] or 0 for r in on)
                    pb = sum(r["pool_buckets"] or 0 for r in on)
                    loads = [f"{r['loadavg_after'][0]:.1f}" for r in on + off if r.get("loadavg_after")]

                    cells = [_mib(b), _fmt(m_on, r_on), _fmt(m_off, r_off),
                             f"{m_on / m_off:.3f}" if m_on and m_off else "—",
                             f"{m_on / base:.2f}" if m_on and base else "—",
                             f"{pb / pc:.2f}" if pc else "—", ", ".join(loads)]
                    L.append("| " + " | ".join(cells) + " |")
                L.append("")
    fails = [r for r in runs if r.get("error")]
    if fails:
        L.append("Failures: " + "; ".join(f"{r['system']} N={r['ranks']} delay {r['delay']} merge "
                                          f"{r['merge']} bucket {r['bucket_mib']}: {r['error']}" for r in fails) + "\n")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
