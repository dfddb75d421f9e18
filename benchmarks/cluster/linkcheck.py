"""Link check between two emulated hosts (run by `python -m benchmarks.cluster
check`, one MPI rank per host): half round-trip time of a ping-pong per
message size, and one-way streaming bandwidth (rank 0 sends a window of
messages, rank 1 acknowledges the window), so the README's claim "a 1 Gbit/s
NIC delivers ~0.9+ Gbit/s and the delay is what was asked for" is measured,
not assumed. Prints one table on rank 0; --json writes it too.
"""
import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI


def pingpong(comm, nbytes: int, reps: int) -> list:
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for i in range(reps + 2):  # 2 untimed rounds open the connection and warm the window
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, 1, 1)
            comm.Recv(buf, 1, 2)
        elif comm.rank == 1:
            comm.Recv(buf, 0, 1)
            comm.Send(buf, 0, 2)
        if i >= 2:
            times.append((time.perf_counter() - t0) / 2)
    return times


def stream(comm, nbytes: int, window: int, reps: int) -> list:
    """Seconds per byte-window: `window` messages of nbytes in flight, then an ack."""
    bufs = [np.zeros(nbytes, np.uint8) for _ in range(window)]
    ack = np.zeros(1, np.uint8)
    times = []
    for i in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            MPI.Request.Waitall([comm.Isend(b, 1, 3) for b in bufs])
            comm.Recv(ack, 1, 4)
        elif comm.rank == 1:
            MPI.Request.Waitall([comm.Irecv(b, 0, 3) for b in bufs])
            comm.Send(ack, 0, 4)
        if i >= 1:
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="8,4096,65536,1048576", help="ping-pong sizes (bytes)")
    ap.add_argument("--stream-mib", type=int, default=64, help="MiB per streaming repetition")
    ap.add_argument("--reps", type=int, default=5, help="streaming repetitions")
    ap.add_argument("--json")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        raise SystemExit("linkcheck needs 2 ranks on 2 hosts")
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        t = pingpong(comm, n, 100 if n < (1 << 20) else 10)
        m = statistics.median(t)
        rows.append({"bytes": n, "half_rtt_us": m * 1e6, "min_us": min(t) * 1e6,
                     "gbit_s": n * 8 / m / 1e9})
    msg = 1 << 20
    window = max(1, (a.stream_mib << 20) // msg)
    t = stream(comm, msg, window, a.reps)
    gbit = [window * msg * 8 / x / 1e9 for x in t]
    if comm.rank == 0:
        print(f"{'bytes':>9} {'half RTT us (median)':>21} {'min us':>8} {'Gbit/s':>7}")
        for r in rows:
            print(f"{r['bytes']:9d} {r['half_rtt_us']:21.1f} {r['min_us']:8.1f} {r['gbit_s']:7.3f}")
        print(f"stream {a.stream_mib} MiB in 1 MiB messages, rank 0 -> 1: median "
              f"{statistics.median(gbit):.3f} Gbit/s "
              f"(repetitions: {', '.join(f'{g:.3f}' for g in gbit)})",
              flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"pingpong": rows, "stream_gbit_s": gbit}, f, indent=1)


if __name__ == "__main__":
    main()
