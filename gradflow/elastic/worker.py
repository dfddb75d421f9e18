"""Worker side of elastic training: the link to gradflowrun's elastic driver
and the forming of each generation's MPI communicator.

Every elastic worker is its own one-process MPI job (the driver starts it
with `mpiexec -n 1`), so no MPI world ever contains a dead process. For each
*generation* (a membership: which workers, in which rank order) the driver
assigns ranks; rank 0 opens an MPI port, the driver relays its name, and the
others connect to it (`MPI_Comm_connect`/`MPI_Comm_accept`, merged into one
intracommunicator, then ordered by the assigned rank). A generation's
communicator is abandoned, never freed collectively, when a peer dies.

The link is one TCP connection carrying JSON lines. Driver -> worker:
``assign`` (gen, rank, size, sync: whether the generation syncs state),
``port`` (gen, port name), ``failure`` (gen,
message: a peer of that generation died), ``hosts_updated`` (gen, removed),
``exit`` (this worker is no longer needed: its host was removed) and
``abort`` (the job ends: below --min-np, reset limit, ...). Worker -> driver:
``hello`` (worker id), ``ready`` (wants the next generation; sync: whether
it wants a state sync there), ``port``
(rank 0 published its port), ``joined`` (connected: the next rank may
connect), ``formed``.
"""
from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

DRIVER_ENV = "GRADFLOW_ELASTIC_DRIVER"    # host:port of gradflowrun's rendezvous
WORKER_ENV = "GRADFLOW_ELASTIC_WORKER"    # this worker's id, given by the driver
TIMEOUT_ENV = "GRADFLOW_ELASTIC_TIMEOUT"  # seconds a rendezvous may take (--elastic-timeout)


class ElasticAbort(SystemExit):
    """The driver ended the job (below --min-np, reset limit, ...) or dismissed
    this worker; code 0 for a dismissal, 1 otherwise. A SystemExit so that
    `except Exception` in training code does not swallow it. Once one is
    raised, this worker's exit is no end of training (DriverLink.finished)."""

    def __init__(self, *args: Any) -> None:
        global _leaving
        _leaving = True
        super().__init__(*args)


_leaving = False  # an ElasticAbort was raised: the worker leaves, training did not finish here


def enabled(environ=None) -> bool:
    """Whether this process was started by gradflowrun in elastic mode."""
    return bool((environ if environ is not None else os.environ).get(DRIVER_ENV))


class DriverLink:
    """This worker's connection to the elastic driver (one per process)."""

    def __init__(self, address: str, worker_id: str, timeout: float):
        host, _, port = address.rpartition(":")
        self.worker_id, self.timeout = worker_id, timeout
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._control: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.gen = -1                  # generation this worker is in (-1: none yet)
        self.rank = -1
        self.failure: Optional[str] = None  # set when a peer of `gen` died
        self.updates = 0               # hosts_updated notices received for `gen`
        self.removed = False           # some update removed a host
        self.added = False             # some update added one
        # The state sync after a reset is one collective: every member of a
        # generation must agree to run it or not. A worker says what it wants
        # (set by the run loop before it asks for the generation); the driver
        # decides for all (a newcomer, or any member that wants it) and the
        # assignment carries the decision.
        self.wants_sync = True
        self.sync = True               # the decision for generation `gen`
        self.on_failure: Callable[[str], None] = lambda message: None
        self.closed = False
        self._send({"op": "hello", "worker": worker_id, "pid": os.getpid()})
        threading.Thread(target=self._read, name="gradflow-elastic-link", daemon=True).start()

    def finished(self) -> None:
        """Tell the driver that this worker's program ends in order (its exit
        hook, before gradflow shuts down). The shutdown makes the others'
        next collective fail at once, and their exits used to reach the
        driver before this one's (MPI_Finalize first): they counted as
        failures before training finished, this exit 0 then as the end of
        training, and gradflowrun exited 0 with 2 of 3 workers crashed.
        Told first, the driver counts them as failed after the finish."""
        if _leaving:
            return
        try:
            self._send({"op": "finished"})
        except ElasticAbort:
            pass  # the driver is gone: nothing to tell

    # ------------------------------------------------------------ transport
    def _send(self, msg: Dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as e:
            sys.stderr.write(f"gradflow elastic: worker {self.worker_id} cannot reach "
                             f"gradflowrun's elastic driver ({e}); leaving\n")
            raise ElasticAbort(1) from None

    def _read(self) -> None:
        f = self._sock.makefile("r", encoding="utf-8")
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            op = msg.get("op")
            if op == "failure":
                if msg.get("gen") == self.gen and self.failure is None:
                    self.failure = str(msg.get("message"))
                    self.on_failure(self.failure)
            elif op == "hosts_updated":
                if msg.get("gen") == self.gen:
                    self.updates += 1
                    self.removed = self.removed or bool(msg.get("removed"))
                    self.added = self.added or not msg.get("removed")
            else:
                self._control.put(msg)
        self.closed = True
        # The driver is gone (gradflowrun was killed): nothing can re-form,
        # so this is a failure without a rollback: the next reset aborts.
        lost = "the connection to gradflowrun's elastic driver was lost"
        self._control.put({"op": "abort", "message": lost})
        if self.failure is None:
            self.failure = lost
        self.on_failure("gradflow elastic: " + lost)

    def _next_control(self, what: str, deadline: float) -> Dict[str, Any]:
        left = deadline - time.monotonic()
        try:
            msg = self._control.get(timeout=max(left, 0.001))
        except queue.Empty:
            raise ElasticAbort(
                f"gradflow elastic: worker {self.worker_id} waited {self.timeout:g} s for {what} "
                "from gradflowrun's driver (--elastic-timeout)") from None
        if msg.get("op") == "abort":
            sys.stderr.write(f"gradflow elastic: {msg.get('message')}\n")
            raise ElasticAbort(1)
        if msg.get("op") == "exit":
            raise ElasticAbort(0)
        return msg

    # ------------------------------------------------------------ generations
    def next_communicator(self):
        """Tell the driver this worker is ready, wait for its assignment and
        form the generation's communicator (an mpi4py intracommunicator)."""
        from mpi4py import MPI  # noqa: PLC0415 - MPI starts here, not at import
        deadline = time.monotonic() + self.timeout
        self._send({"op": "ready", "gen": self.gen, "sync": self.wants_sync})
        msg = self._next_control("an assignment", deadline)
        while msg.get("op") != "assign":
            msg = self._next_control("an assignment", deadline)
        gen, rank, size = int(msg["gen"]), int(msg["rank"]), int(msg["size"])
        self.gen, self.rank, self.failure = gen, rank, None
        self.sync = bool(msg.get("sync", True))
        self.updates, self.removed, self.added = 0, False, False
        comm = form_communicator(MPI, rank, size,
                                 publish=lambda port: self._send({"op": "port", "gen": gen,
                                                                  "port": port}),
                                 lookup=lambda: self._port_of(gen, deadline),
                                 joined=lambda: self._send({"op": "joined", "gen": gen}))
        self._send({"op": "formed", "gen": gen})
        return comm

    def _port_of(self, gen: int, deadline: float) -> str:
        while True:
            msg = self._next_control("rank 0's MPI port", deadline)
            if msg.get("op") == "port" and msg.get("gen") == gen:
                return str(msg["port"])


def form_communicator(MPI, rank: int, size: int, publish: Callable[[str], None],
                      lookup: Callable[[], str], joined: Callable[[], None] = lambda: None):
    """The intracommunicator of `size` workers with this one at `rank`.
    Rank 0 opens a port and publishes it; the others connect one at a time
    (`lookup` returns the port once the previous rank has `joined`; the
    driver sequences them), and whoever has joined takes part in the next
    accept, so the group grows one worker per accept. The final split
    orders it by rank."""
    if size == 1:
        return MPI.COMM_SELF.Dup()
    # Nothing made here is freed: freeing the intercommunicator of a
    # Connect after merging it crashed MPICH 5.0 (ucx) in the next Accept.
    # A generation leaks a few handles; there are --reset-limit of them.
    keep = []
    if rank == 0:
        port = MPI.Open_port()
        publish(port)
        comm = MPI.COMM_SELF
    else:
        port = lookup()
        inter = MPI.COMM_SELF.Connect(port, root=0)
        comm = inter.Merge(high=True)
        keep.append(inter)
        joined()
    while comm.Get_size() < size:
        inter = comm.Accept(port, root=0)
        keep += [inter, comm]
        comm = inter.Merge(high=False)
    if rank == 0:
        MPI.Close_port(port)
    _kept.extend(keep)
    return comm.Split(0, rank)


_kept: list = []  # see form_communicator

_link: Optional[DriverLink] = None


def link() -> DriverLink:
    """This process's driver link, made on first use (from the environment
    gradflowrun set)."""
    global _link
    if _link is None:
        address = os.environ.get(DRIVER_ENV, "")
        if not address:
            raise RuntimeError("gradflow elastic: not started by gradflowrun in elastic mode "
                               f"({DRIVER_ENV} is not set)")
        try:
            timeout = float(os.environ.get(TIMEOUT_ENV, "600"))
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={os.environ.get(TIMEOUT_ENV)!r}: expected seconds")
        _link = DriverLink(address, os.environ.get(WORKER_ENV, str(os.getpid())), timeout)
    return _link


def current() -> Optional[DriverLink]:
    """The link if one was made (elastic mode, after init())."""
    return _link
