"""gradflowrun's elastic driver: starts one worker process per slot (each
its own `mpiexec -n 1` job), runs the rendezvous that tells workers which
generation (membership, rank order) they are in, and reacts to membership
changes:

* a worker dies (non-zero exit, signal): its host is blacklisted, the other
  workers of its generation are told (their collectives raise
  HorovodInternalError: they roll back to their last commit), and once all
  survivors are ready again a new generation forms without it; once
  training has finished (a worker exited 0) they are still told, but no
  generation forms again and the job ends with the dead worker's code;
* hosts appear (discovery script): workers are started there (up to
  --max-np); once one is ready, the running workers are told the hosts
  changed (HostsUpdatedInterrupt at their next commit) and the next
  generation includes it; it receives the state by broadcast (State.sync);
* hosts disappear or lose slots (two discovery answers in a row say so:
  elastic_hosts.py): the workers beyond their slots are dismissed at the
  next reset;
* fewer than --min-np workers can be had for --elastic-timeout seconds, or
  more than --reset-limit resets: the job ends with a message naming what
  was lost.

One thread runs the state machine (``_handle``); socket readers, process
watchers and the discovery poller only put events on its queue, so the
bookkeeping needs no locks. Forming a generation (who, the port exchange,
its deadline) is elastic_forming.py. The worker side is
gradflow/elastic/worker.py.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

try:
    from . import hosts as _hosts
    from .elastic_forming import GenerationForming
    from .elastic_hosts import HostManager
except ImportError:  # run as a script
    import hosts as _hosts  # type: ignore[no-redef]
    from elastic_forming import GenerationForming  # type: ignore[no-redef]
    from elastic_hosts import HostManager  # type: ignore[no-redef]

DRIVER_ENV, WORKER_ENV, TIMEOUT_ENV = ("GRADFLOW_ELASTIC_DRIVER", "GRADFLOW_ELASTIC_WORKER",
                                       "GRADFLOW_ELASTIC_TIMEOUT")  # = gradflow/elastic/worker.py
DISCOVERY_INTERVAL = 1.0  # seconds between runs of the discovery script (Horovod's)
ABORT_GRACE = 10.0        # seconds workers get to leave after an abort before SIGKILL


def describe_code(code: int) -> str:
    """A worker's `mpiexec -n 1` exit code in words. Hydra exits with the
    signal number when its process was killed, so 9 may be SIGKILL."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    text = f"exited with code {code}"
    if code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGTERM, signal.SIGBUS):
        text += f" ({signal.Signals(code).name}, if it was killed)"
    return text


class Worker:
    def __init__(self, wid: str, host: str, slot: int):
        self.id, self.host, self.slot = wid, host, slot
        self.proc: Optional[subprocess.Popen] = None
        self.conn: Optional[socket.socket] = None
        self.state = "starting"   # starting -> ready <-> running -> exited
        self.gen = -1             # generation it runs in
        self.rank = -1            # its rank there
        self.formed = False
        self.dismiss = False      # its host was removed: send `exit` when ready
        self.wants_sync = True    # its last `ready` asked for a state sync
        self.told = False         # sent a failure notice in its generation
        self.finishing = False    # its program ends in order (worker.py finished())
        self.started = time.monotonic()

    def send(self, msg: Dict) -> None:
        if self.conn is None:
            return
        try:
            self.conn.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass  # its exit shows up as an `exit` event

    def label(self) -> str:
        where = f"worker {self.id} on host {self.host}"
        return f"rank {self.rank} ({where})" if self.rank >= 0 else where


class ElasticDriver(GenerationForming):
    def __init__(self, command: Sequence[str], env: Dict[str, str], hosts: HostManager,
                 np: int, min_np: int, max_np: int, elastic_timeout: float,
                 reset_limit: Optional[int], start_timeout: float, mpiexec: str,
                 mpi_args: Sequence[str] = (), advertise: Optional[str] = None,
                 verbose: bool = False):
        self.command, self.env, self.hosts = list(command), dict(env), hosts
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.timeout, self.reset_limit, self.start_timeout = elastic_timeout, reset_limit, start_timeout
        self.mpiexec, self.mpi_args, self.verbose = mpiexec, list(mpi_args), verbose
        self.events: "queue.Queue[tuple]" = queue.Queue()
        self.workers: Dict[str, Worker] = {}
        self.ids = itertools.count()
        self.gen = -1
        self.forming: List[Worker] = []
        self.port = ""                       # rank 0's MPI port of the forming generation
        self.forming_since = 0.0             # when the forming generation was assigned
        self.joined: set = set()             # its ranks connected so far (0: port opened)
        self.members: List[Worker] = []      # the last formed generation, by rank
        self.resets = 0
        self.counted_gen = -1                # the generation whose end was counted as a reset
        self.notified_gen = -1               # generation told about waiting newcomers
        self.finished = False                # a worker ended its training successfully
        # The first worker that failed once another had finished (a crash in
        # a checkpoint save after train()): no reset can mend it, and the
        # job must not report success. (what, exit code)
        self.failed_after_finish: Optional[tuple] = None
        # Failures of members seen while another member was finishing: if that
        # one then exits 0 they came after the end of training (its shutdown
        # made their collectives fail), not during it. (what, exit code)
        self.failed_while_finishing: List[tuple] = []
        self.lost: List[str] = []            # what failed, for the final message
        self.aborted: Optional[str] = None
        self.below_min_since: Optional[float] = None
        self.short_since: Optional[float] = None   # Note [A removal below --min-np waits]
        self.discovery_error = ""            # the discovery script's error last said
        self.cooldowns_seen: Dict[str, float] = {}  # host -> the cooldown end acted on
        self.server = socket.create_server(("0.0.0.0", 0))
        port = self.server.getsockname()[1]
        self.address = f"{advertise or '127.0.0.1'}:{port}"

    # ------------------------------------------------------------ output
    def note(self, text: str) -> None:
        sys.stderr.write(f"gradflowrun elastic: {text}\n")
        sys.stderr.flush()

    # ------------------------------------------------------------ threads
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._read_loop, args=(conn,), daemon=True).start()

    def _read_loop(self, conn: socket.socket) -> None:
        wid = None
        try:
            for line in conn.makefile("r", encoding="utf-8"):
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("op") == "hello":
                    wid = str(msg.get("worker"))
                    self.events.put(("hello", wid, conn))
                elif wid is not None:
                    self.events.put(("msg", wid, msg))
        except OSError:
            pass  # the worker died: its process watcher reports it

    def _watch(self, w: Worker) -> None:
        code = w.proc.wait()
        self.events.put(("exit", w.id, code))

    def _discovery_loop(self) -> None:
        while True:
            time.sleep(DISCOVERY_INTERVAL)
            self.events.put(("hosts", self.hosts.discover()))

    # ------------------------------------------------------------ workers
    def _launch(self, host: str, slot: int) -> Worker:
        w = Worker(str(next(self.ids)), host, slot)
        env = dict(self.env)
        env[DRIVER_ENV], env[WORKER_ENV], env[TIMEOUT_ENV] = self.address, w.id, repr(self.timeout)
        argv = [self.mpiexec, *self.mpi_args]
        if not _hosts.is_local_host(host):
            argv += ["-hosts", host]
        argv += ["-n", "1", *self.command]
        if self.verbose:
            self.note(f"starting worker {w.id} on {host}: {' '.join(argv)}")
        w.proc = subprocess.Popen(argv, env=env, start_new_session=True)
        self.workers[w.id] = w
        threading.Thread(target=self._watch, args=(w,), daemon=True).start()
        return w

    def _alive(self) -> List[Worker]:
        return [w for w in self.workers.values() if w.state != "exited"]

    def _fill_slots(self) -> None:
        """Start workers on usable hosts' free slots, up to --max-np."""
        if self.finished or self.aborted:
            return
        alive = [w for w in self._alive() if not w.dismiss]
        if len(alive) >= self.max_np:
            return
        used: Dict[str, int] = {}
        for w in alive:
            used[w.host] = used.get(w.host, 0) + 1
        for host, slots in self.hosts.usable().items():
            while used.get(host, 0) < slots and len(alive) < self.max_np:
                alive.append(self._launch(host, used.get(host, 0)))
                used[host] = used.get(host, 0) + 1

    # ------------------------------------------------------------ generations
    def _lost_text(self) -> str:
        return ("; lost: " + "; ".join(self.lost)) if self.lost else ""

    def _abort(self, why: str) -> None:
        if self.aborted:
            return
        self.aborted = f"the elastic job ended: {why}"
        self.note(self.aborted)
        for w in self._alive():
            if w.state == "running":
                # It may be blocked in a collective with the peer that just
                # died (--reset-limit): the failure notice interrupts it as for
                # a reset; asking for the next generation, it reads the abort,
                # prints it and exits 1 (else SIGKILL after ABORT_GRACE).
                w.send({"op": "failure", "gen": w.gen,
                        "message": f"gradflowrun elastic: {self.aborted}"})
            w.send({"op": "abort", "message": self.aborted})
        self.abort_deadline = time.monotonic() + ABORT_GRACE

    # ------------------------------------------------------------ events
    def _handle(self, event: tuple) -> None:
        kind = event[0]
        if kind == "hello":
            w = self.workers.get(event[1])
            if w is None:
                event[2].close()
                return
            w.conn = event[2]
        elif kind == "msg":
            self._on_message(self.workers.get(event[1]), event[2])
        elif kind == "exit":
            self._on_exit(self.workers[event[1]], event[2])
        elif kind == "hosts":
            self._on_hosts(event[1])

    def _on_message(self, w: Optional[Worker], msg: Dict) -> None:
        if w is None:
            return
        op = msg.get("op")
        if op == "ready":
            if msg.get("gen") != w.gen:
                return  # stale (not the generation it is in)
            if w.dismiss:
                w.send({"op": "exit"})
                return
            if w.gen < 0 and self.gen >= 0:
                self.note(f"worker {w.id} on host {w.host} ready "
                          f"{time.monotonic() - w.started:.1f} s after its start; it joins at "
                          "the running workers' next commit")
            w.state = "ready"
            w.wants_sync = bool(msg.get("sync", True))
        elif op == "finished":
            if w.state in ("running", "ready") and not w.dismiss:
                # Its program ends in order (worker.py, finished()); if it exits 0,
                # members that fail from here on failed after the finish.
                w.finishing = True
        else:
            self._on_forming_message(w, op, msg)

    def _on_exit(self, w: Worker, code: int) -> None:
        was = w.state
        w.state = "exited"
        if w.dismiss or self.aborted:
            return  # dismissed, or leaving as told after the abort: nothing to report
        if code == 0:
            if not self.finished and was in ("running", "ready"):
                self.finished = True  # training ended: the others finish too; no more resets
                if w.finishing and self.failed_while_finishing and \
                        self.failed_after_finish is None:
                    self.failed_after_finish = self.failed_while_finishing[0]
                return
            if was == "starting":
                what = (f"{w.label()} exited with code 0 before joining the rendezvous (did it "
                        "call gradflow.init()? does it import the gradflow this gradflowrun "
                        "belongs to?)")
                self.lost.append(what)
                self.note(what)
            return
        what = f"{w.label()} {describe_code(code)}"
        if w.told:  # likely a consequence (it did not roll back): say so
            what += ", after it was told of a peer's failure"
        if not self.finished and any(m.finishing and m is not w for m in self.members):
            self.failed_while_finishing.append((what, code))
        self.lost.append(what)
        delay = self.hosts.blacklist(w.host)
        # "Blacklisted" means no new worker there; its running workers go on
        # (said, since Horovod's driver also drops them: helper-20's audit).
        self.note(f"{what}; host {w.host} blacklisted "
                  + ("for the rest of the job" if delay == float("inf") else f"for {delay:g} s")
                  + " (no new worker starts there; its running workers go on)")
        if self.finished:
            if self.failed_after_finish is None:
                self.failed_after_finish = (what, code)
            # No reset follows a finished training, but a member may still
            # wait for this one in a collective (a process set without the
            # finished workers, the tail of the last allreduce): tell it, as
            # gradflowrun's notice does outside elastic mode, or it waits
            # GRADFLOW_TIMEOUT (60 s). If it rolls back, _try_form ends it.
            self._tell_members(w, f"gradflowrun elastic: {what} after training finished on "
                                  "another worker (no reset follows a finished training)")
            return
        if w in self.forming:
            # Its peers are inside MPI_Comm_accept/connect with it and cannot
            # be interrupted: end the job rather than hang.
            self._abort(f"{what} while generation {self.gen} was forming")
            return
        if w in self.members:
            if not self._count_reset(what):
                return
            self._tell_members(w, f"gradflowrun elastic: {what}")
        self._fill_slots()

    def _count_reset(self, why: str) -> bool:
        """Note [What --reset-limit counts]: one reset per generation that
        ends and re-forms, whatever ended it (workers lost, hosts added or
        removed), as Horovod counts its rendezvous after the first; several
        workers lost together (a host with 2 slots) are one. Before
        2026-11-29 each lost worker counted and a host change did not:
        --reset-limit 1 ended a job at a 2-slot host's loss, which Horovod
        survives. False (after ending the job) past the limit."""
        if self.counted_gen == self.gen:
            return True
        self.counted_gen = self.gen
        self.resets += 1
        if self.reset_limit is not None and self.resets > self.reset_limit:
            self._abort(f"{why}; that is reset {self.resets}, more than --reset-limit "
                        f"{self.reset_limit}" + self._lost_text())
            return False
        return True

    def _tell_members(self, dead: Worker, message: str) -> None:
        """The failure notice to the running members of the dead worker's
        generation: their waits fail at once (worker.py, on_failure)."""
        if dead not in self.members:
            return
        for m in self.members:
            if m is not dead and m.state == "running":
                m.told = True
                m.send({"op": "failure", "gen": self.gen, "message": message})

    def _on_hosts(self, known: Dict[str, int]) -> None:
        # A failing script is said once (and again if its error changes), and
        # when it works again: it runs every second, and its note used to
        # fill gradflowrun's output once a second for as long as it failed.
        error = self.hosts.last_error
        if error != self.discovery_error:
            self.note(error or f"host discovery script {self.hosts.script!r} works again")
            self.discovery_error = error
        # A host gone, or with fewer slots than it has workers (confirmed by
        # two answers: Note [A host removal is confirmed]): dismiss the
        # workers beyond its slots, as Horovod does, newcomers first, then
        # the highest ranks (rank 0 holds the state). Before 2026-11-29 a
        # lowered slot count dismissed no one.
        by_host: Dict[str, List[Worker]] = {}
        for w in self._alive():
            if not w.dismiss:
                by_host.setdefault(w.host, []).append(w)
        # The generation they run in may still be forming (self.members is
        # then the last one): told only the formed one, a worker whose host
        # left during forming trained on to the end (2026-11-29).
        group = self.forming or self.members
        removed: List[Worker] = []
        for host, ws in by_host.items():
            ws.sort(key=lambda w: (w in group, -w.rank, -int(w.id)))
            removed += ws[:max(0, len(ws) - known.get(host, 0))]
        if not removed:
            self.short_since = None
        elif not self._removal_leaves_enough(removed):
            removed = []  # they stay; new slots are still filled
        for w in removed:
            w.dismiss = True
            if w.state == "ready":
                w.send({"op": "exit"})
        if any(w in group for w in removed):
            for m in group:
                m.send({"op": "hosts_updated", "gen": self.gen, "removed": True})
        self._fill_slots()

    def _removal_leaves_enough(self, removed: List[Worker]) -> bool:
        """Note [A removal below --min-np waits]: whether dismissing `removed`
        leaves at least --min-np workers. If not, they go on training (the
        script may list its hosts again: an empty answer twice, a cluster
        API down for a while) and the job ends only once the script has
        listed too few slots for --elastic-timeout, as Horovod waits that
        long for --min-np slots. Before 2026-11-29 a script that printed
        nothing for 2 s dismissed every worker: the state was lost and the
        job ended, `every worker failed`."""
        left = len([w for w in self._alive() if not w.dismiss and w not in removed])
        if left >= self.min_np:
            self.short_since = None
            return True
        now = time.monotonic()
        if self.short_since is None:
            self.short_since = now
            self.note(f"the host discovery script lists too few slots: dismissing the workers "
                      f"beyond them ({', '.join(w.label() for w in removed)}) would leave {left}, "
                      f"fewer than --min-np {self.min_np}; they go on until it lists enough or "
                      f"--elastic-timeout ({self.timeout:g} s) passes")
        elif now - self.short_since > self.timeout:
            self._abort(f"the host discovery script listed too few slots for {self.timeout:g} s "
                        f"(--elastic-timeout): without {', '.join(w.label() for w in removed)}, "
                        f"{left} worker(s), fewer than --min-np {self.min_np}" + self._lost_text())
        return False

    # ------------------------------------------------------------ main loop
    def run(self) -> int:
        threading.Thread(target=self._accept_loop, daemon=True).start()
        self.hosts.discover()
        usable = self.hosts.usable()
        if sum(usable.values()) < self.min_np:
            self.note(f"error: {sum(usable.values())} slot(s) available, fewer than --min-np "
                      f"{self.min_np}" + (f" ({self.hosts.last_error})" if self.hosts.last_error
                                           else ""))
            return 2
        self._fill_slots_first()
        if self.hosts.script is not None:
            threading.Thread(target=self._discovery_loop, daemon=True).start()
        try:
            while self._alive():
                try:
                    self._handle(self.events.get(timeout=0.2))
                except queue.Empty:
                    pass
                self._after_cooldowns()
                self._try_form()
                self._check_forming()
                self._notify_newcomers()
                if self.aborted and time.monotonic() > self.abort_deadline:
                    for w in self._alive():
                        self._kill(w)
        except KeyboardInterrupt:
            for w in self._alive():
                self._kill(w)
            return 130
        finally:
            self.server.close()
        return self._exit_code()

    def _after_cooldowns(self) -> None:
        """Note [A cooldown ends on a fixed host list]: a host whose
        --blacklist-cooldown-range cooldown has ended gets workers again.
        Only the discovery poller (every second) and a worker's exit
        filled free slots, so on a fixed host list (-H/-np, no discovery
        script) the host never came back: a -np 2 --min-np 2 job that lost
        a worker waited --elastic-timeout and ended (2026-11-29)."""
        if self.hosts.script is not None:
            return  # the discovery poller fills the slots
        now = time.monotonic()
        ended = {h: t for h, t in self.hosts.blacklisted_until.items()
                 if t <= now and self.cooldowns_seen.get(h) != t}
        if ended:
            self.cooldowns_seen.update(ended)
            self._fill_slots()

    def _exit_code(self) -> int:
        """gradflowrun's exit status once every worker has exited: 0 only
        if training finished and no worker failed afterwards; a worker that
        failed after another finished gives its own code (128 + N for a
        signal N), like a failed rank of a non-elastic job."""
        if self.aborted:
            return 1
        if self.finished and self.failed_after_finish is not None:
            what, code = self.failed_after_finish
            self.note(f"training finished, but {what} afterwards")
            return code if code > 0 else 128 - code
        if self.finished:
            return 0
        self.note("every worker failed" + self._lost_text())
        return 1

    def _fill_slots_first(self) -> None:
        """The first workers: -np of them (at most --max-np) on usable slots."""
        want = min(self.np, self.max_np)
        for host, slots in self.hosts.usable().items():
            for slot in range(slots):
                if len(self.workers) < want:
                    self._launch(host, slot)

    @staticmethod
    def _kill(w: Worker) -> None:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
