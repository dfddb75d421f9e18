#!/usr/bin/env python3
"""Constant one-way delay for one emulated host, for kernels without netem.

The harness adds `iptables -t mangle -A PREROUTING -i gfnet0 -j NFQUEUE
--queue-num Q` inside the host's namespace and starts this daemon there. The
kernel hands every arriving packet to us (metadata only: NFQNL_COPY_META;
GSO packets whole: NFQA_CFG_F_GSO), we keep (due time, packet id) and give
the verdict ACCEPT when the packet is due. The delay is the same for every
packet, so due times are in arrival order and one batch verdict (accept all
ids <= X) releases everything that is due at once.

Standard library only (raw netlink), so it runs with any python3. Started by
_topology.py as `python3 _delayd.py --delay-us D --ready-file F`; stops on
SIGTERM/SIGINT, releasing what it still holds.
"""
import argparse
import collections
import ctypes
import os
import select
import signal
import socket
import struct
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_VERDICT_BATCH, MSG_CONFIG = 0, 3, 2
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND, CMD_UNBIND = 1, 2
COPY_META = 1
F_FAIL_OPEN, F_GSO = 0x1, 0x4
ATTR_PACKET_HDR, ATTR_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
PACKET_MSG_TYPE = (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes(-length % 4)


class Queue:
    """One bound NFQUEUE: configuration requests, packet ids in, verdicts out."""

    def __init__(self, num: int, maxlen: int):
        self.num, self.seq = num, 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        for opt, val in ((33, 64 << 20), (socket.SO_RCVBUF, 64 << 20)):  # 33: SO_RCVBUFFORCE
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, val)
                break
            except OSError:
                continue
        try:  # keep going when the socket overflows instead of failing recv with ENOBUFS
            self.sock.setsockopt(270, 5, 1)  # SOL_NETLINK, NETLINK_NO_ENOBUFS
        except OSError:
            pass
        self.request([attr(CFG_CMD, struct.pack("!BxH", CMD_BIND, socket.AF_INET))])
        self.request([attr(CFG_PARAMS, struct.pack("!IB", 0, COPY_META))])
        self.request([attr(CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))])
        # fail open: a full queue passes packets undelayed rather than dropping them
        flags = struct.pack("!I", F_GSO | F_FAIL_OPEN)
        self.request([attr(CFG_FLAGS, flags), attr(CFG_MASK, flags)])

    def message(self, mtype: int, attrs, flags: int = NLM_F_REQUEST) -> bytes:
        self.seq += 1
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.num)) + b"".join(attrs)
        header = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | mtype, flags,
                             self.seq, 0)
        return header + body

    def request(self, attrs) -> None:
        """Send a config message and wait for the kernel's acknowledgement."""
        self.sock.send(self.message(MSG_CONFIG, attrs, NLM_F_REQUEST | NLM_F_ACK))
        while True:
            data = self.sock.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, off)
                if kind == NLMSG_ERROR and seq == self.seq:
                    err = -struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise OSError(err, f"nfqueue configuration: {os.strerror(err)}")
                    return
                off += (length + 3) & ~3

    def accept_up_to(self, packet_id: int) -> None:
        verdict = attr(ATTR_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        self.sock.send(self.message(MSG_VERDICT_BATCH, [verdict]))

    def unbind(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.send(self.message(MSG_CONFIG, [attr(CFG_CMD, struct.pack("!BxH", CMD_UNBIND,
                                                                               socket.AF_INET))]))
        except OSError:
            pass


def packet_ids(buf: bytearray, n: int):
    """Packet ids of the NFQNL_MSG_PACKET messages in buf[:n]."""
    off = 0
    while off + 16 <= n:
        length, kind = struct.unpack_from("=IH", buf, off)
        if length < 16:
            return
        if kind == PACKET_MSG_TYPE:
            pos, end = off + 20, off + length  # 16 netlink header + 4 nfgenmsg
            while pos + 4 <= end:
                alen, atype = struct.unpack_from("=HH", buf, pos)
                if atype & 0x3FFF == ATTR_PACKET_HDR:
                    yield struct.unpack_from("!I", buf, pos + 4)[0]
                    break
                if alen < 4:
                    break
                pos += (alen + 3) & ~3
        off += (length + 3) & ~3


def serve(q: Queue, delay_ns: int, spin_ns: int, running) -> None:
    held = collections.deque()  # (due ns, packet id), in arrival = due order
    buf = bytearray(4 << 20)
    fd = q.sock.fileno()
    q.sock.setblocking(False)
    while running[0]:
        now = time.monotonic_ns()
        wait = (held[0][0] - now) if held else 500_000_000
        if wait > spin_ns:
            # sleep until shortly before the next release (or a packet arrives)
            select.select([fd], [], [], (wait - spin_ns) / 1e9)
        elif wait > 0:
            # the last stretch busy-waits: a VM's timer wake-up is too coarse
            while time.monotonic_ns() < held[0][0] and not select.select([fd], [], [], 0)[0]:
                pass
        while True:
            try:
                n = q.sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ENOBUFS: the kernel already failed the packets open
                break
            due = time.monotonic_ns() + delay_ns
            held.extend((due, pid) for pid in packet_ids(buf, n))
        now = time.monotonic_ns()
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:
            q.accept_up_to(last)
    if held:
        q.accept_up_to(held[-1][1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-us", type=float, required=True, help="one-way delay to add")
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--maxlen", type=int, default=65536, help="packets the kernel may queue")
    ap.add_argument("--spin-us", type=float, default=100,
                    help="busy-wait this long before a release")
    ap.add_argument("--overhead-us", type=float, default=40,
                    help="the NFQUEUE round trip through user space (measured ~40 us here), "
                         "subtracted so that the total added delay is --delay-us")
    ap.add_argument("--ready-file", help="created once the queue is bound")
    a = ap.parse_args()
    try:  # timer slack 1 us (default 50 us) so short sleeps end on time
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass
    q = Queue(a.queue, a.maxlen)
    running = [True]

    def stop(*_):
        running[0] = False
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if a.ready_file:
        with open(a.ready_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    try:
        serve(q, max(0, int((a.delay_us - a.overhead_us) * 1000)), int(a.spin_us * 1000), running)
    finally:
        q.unbind()


if __name__ == "__main__":
    main()
