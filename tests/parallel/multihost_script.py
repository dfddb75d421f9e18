"""Run by test_multihost.py on 2 emulated hosts (network namespaces), 2 ranks
each: rank placement and local/cross ranks match the -H list, and an
allreduce's bytes really cross the hosts' network interface, with the
algorithm GRADFLOW_ALLREDUCE_ALGO (two-sync: MPI_Get, no shared memory);
the stats must show that algorithm ran."""
import os
import socket

import numpy as np

import gradflow as gf

IFACE = os.environ.get("GRADFLOW_TEST_IFACE", "gfnet0")  # the emulated cluster's NIC
ALGO = os.environ.get("GRADFLOW_ALLREDUCE_ALGO", "ring")

gf.init()
R, N = gf.rank(), gf.size()
host = socket.gethostname()
names = gf.allgather(np.frombuffer(host.encode().ljust(64, b"\0")[:64], np.uint8).reshape(1, 64),
                     name="hostnames")
hosts = [bytes(row).rstrip(b"\0").decode() for row in names]
same = [r for r in range(N) if hosts[r] == host]
assert gf.local_size() == len(same) == 2, (hosts, gf.local_size())
assert gf.local_rank() == same.index(R) == R % 2, (hosts, gf.local_rank())
assert gf.cross_size() == 2 and gf.cross_rank() == R // 2, (gf.cross_rank(), gf.cross_size())


def tx_bytes():
    with open(f"/sys/class/net/{IFACE}/statistics/tx_bytes") as f:
        return int(f.read())


before = tx_bytes()
x = np.full(4 << 20, R + 1, np.float32)  # 16 MiB
gf.reset_stats()
got = gf.allreduce(x, op=gf.Sum, name="over.the.wire")
assert (got == N * (N + 1) / 2).all()
assert gf.stats().get(f"allreduce.count.{ALGO}.fp32") == 1, gf.stats()
sent = gf.allgather(np.array([tx_bytes() - before], np.int64), name="tx")
# 4 ranks on 2 hosts: each host's link carries >= one 16 MiB/4 segment (ring
# hops, or two-sync's MPI_Gets of remote segments).
assert all(int(s) >= (4 << 20) for s in sent[::2]), sent.tolist()
print(f"multihost rank {R}: host {host} local {gf.local_rank()}/{gf.local_size()} "
      f"cross {gf.cross_rank()}/{gf.cross_size()} tx {int(sent[R]) >> 20} MiB", flush=True)
for i, count in enumerate([1000, 1000, 300_001, 300_001, 7]):  # windows alternate and grow
    y = np.arange(count, dtype=np.float32) % 97 + R
    got = gf.allreduce(y, op=gf.Sum, name=f"sizes.{i}")
    np.testing.assert_array_equal(got, sum(np.arange(count, dtype=np.float32) % 97 + r for r in range(N)))
assert gf.stats().get(f"allreduce.count.{ALGO}.fp32") == 6, gf.stats()
gf.barrier()
if R == 0:
    print(f"multihost OK: {N} ranks with {ALGO} on hosts {hosts}", flush=True)
