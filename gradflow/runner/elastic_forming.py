"""The elastic driver's generation forming (a mixin of ElasticDriver,
elastic_driver.py, which owns the workers and the event loop): when the
next generation forms and with whom (survivors first, in their old rank
order, then newcomers), telling running members that newcomers wait, the
assign / port / joined / formed exchange by which rank 0 opens its MPI port
and the others connect one at a time, and the deadline by which a
generation must have formed (Note [A generation that does not form]).
It reads and sets the driver's state (workers, gen, forming, members, ...)
and calls its _alive, _abort, _lost_text and note; the worker side of the
exchange is gradflow/elastic/worker.py.
"""
from __future__ import annotations

import time
from typing import Any, Dict

# Note [A generation that does not form]: MPI_Comm_accept has no deadline;
# MPICH's MPI_Comm_connect bounds its handshake (180 s) but not the exchange
# after it; neither can be interrupted. A member that never reached its
# accept, or a stalled connection, hung the job for ever (once under load: a
# grown keras job's newcomer in PMPI_Comm_connect). So a generation must
# form within --elastic-timeout (the worker side's rendezvous bound too), at
# least FORM_TIMEOUT_FLOOR (connects on a loaded host are slow); else the job
# ends naming where forming stopped, and its workers are killed after
# ABORT_GRACE (inside MPI they cannot read the abort).
FORM_TIMEOUT_FLOOR = 60.0


class GenerationForming:
    """ElasticDriver's generation forming (see the module docstring)."""

    def _try_form(self) -> None:
        if self.finished:  # training ended: workers waiting for a generation leave
            for w in self._alive():
                if w.state == "ready" and not w.dismiss:
                    w.dismiss = True
                    if w.gen >= 0 and self.failed_after_finish is not None:
                        # It rolled back after that failure: it did not finish
                        # and must not look as if it had (exit 1, saying why).
                        w.send({"op": "abort", "message": (
                            f"training finished on another worker, then "
                            f"{self.failed_after_finish[0]}; no new generation forms after a "
                            f"finished training, so worker {w.id} leaves")})
                    else:
                        w.send({"op": "exit"})
        if self.forming or self.aborted or self.finished:
            return
        alive = self._alive()
        if any(w.state == "running" for w in alive):
            return
        ready = [w for w in alive if w.state == "ready" and not w.dismiss]
        starting = [w for w in alive if w.state == "starting"]
        now = time.monotonic()
        if self.gen < 0 and starting and now - min(w.started for w in starting) < self.start_timeout:
            return  # first generation: wait for everyone launched (bounded)
        if len(ready) < self.min_np:
            if self.below_min_since is None:
                self.below_min_since = now
            if ready and self._never_enough(alive):  # (none ready: the job ends by itself)
                self._abort(f"{len(ready)} worker(s) ready, fewer than --min-np {self.min_np}, "
                            "and no other can ever start (a fixed host list, every host with "
                            "a free slot blacklisted for the rest of the job)" + self._lost_text())
            elif now - self.below_min_since > self.timeout:
                self._abort(f"{len(ready)} worker(s) ready, fewer than --min-np {self.min_np}, "
                            f"for {self.timeout:g} s (--elastic-timeout)" + self._lost_text())
            return
        self.below_min_since = None
        if self.gen >= 0 and not self._count_reset(f"generation {self.gen} re-forms (hosts "
                                                   "added or removed)"):
            return  # Note [What --reset-limit counts] (elastic_driver.py)
        # Survivors first, in their old rank order (rank 0 holds the state
        # State.sync broadcasts), then newcomers in arrival order.
        ready.sort(key=lambda w: (w.rank < 0, w.rank, int(w.id)))
        members = ready[:self.max_np]
        # State.sync is a collective: all members run it or none does. A
        # survivor decides to skip it (hosts only removed) before it knows
        # the membership; a newcomer (never in a generation) must receive
        # the state. Deciding here, for all, keeps them from pairing a sync
        # with none (a stall, then a crash: a host removed while another
        # was added).
        sync = any(w.gen < 0 or w.wants_sync for w in members)
        if self.gen >= 0 and all(w.gen < 0 for w in members):
            # Every worker that held the trained state is gone (died, or
            # dismissed with its host): the job goes on, but from the start.
            self.note(f"no worker of generation {self.gen} is left: generation {self.gen + 1} "
                      "starts from the program's initial state (the progress so far is lost)")
        self.gen += 1
        self.forming, self.forming_since, self.joined = members, time.monotonic(), set()
        for r, w in enumerate(members):
            w.state, w.gen, w.rank, w.formed, w.told = "running", self.gen, r, False, False
        for w in members:
            w.send({"op": "assign", "gen": self.gen, "rank": w.rank, "size": len(members),
                    "sync": sync})
        self.note(f"generation {self.gen}: {len(members)} worker(s) on "
                  + ", ".join(sorted({w.host for w in members})))

    def _never_enough(self, alive: Any) -> bool:
        """Note [Below --min-np for good]: whether --min-np workers can never
        be had again: the hosts are fixed (-H/-np/--hostfile, no discovery
        script), blacklisting is for the rest of the job (no
        --blacklist-cooldown-range), and the workers still alive plus the
        free slots of hosts not blacklisted are fewer than --min-np. Waiting
        --elastic-timeout (600 s by default) then only delays the end: a
        2-worker --min-np 2 job whose rank 0 exited of a stall (a commit()
        on some ranks only) while rank 1, told of it, rolled back and asked
        for a generation hung 600 s (seen once in 19 runs by helper-29;
        made certain by a 3 s pause on rank 1 before its except clause)."""
        if self.hosts.script is not None or self.hosts.cooldown is not None:
            return False  # a host may come (discovery) or come back (cooldown)
        usable = self.hosts.usable()
        kept = [w for w in alive if not w.dismiss]
        free = sum(max(0, slots - sum(1 for w in kept if w.host == host))
                   for host, slots in usable.items())
        return min(len(kept) + free, self.max_np) < self.min_np

    def _notify_newcomers(self) -> None:
        """A worker is ready but not in the running generation (it started
        late, or became ready while a generation formed): tell the running
        ones once per generation; they re-form at their next commit."""
        if self.forming or self.notified_gen == self.gen:
            return
        running = [m for m in self.members if m.state == "running"]
        if running and any(w.state == "ready" and not w.dismiss and w not in self.members
                           for w in self._alive()):
            self.notified_gen = self.gen
            for m in self.members:
                m.send({"op": "hosts_updated", "gen": self.gen, "removed": False})

    def _on_forming_message(self, w: Any, op: Any, msg: Dict) -> None:
        """A worker's message about the forming generation (port, joined,
        formed); others are ignored."""
        if op == "port" and msg.get("gen") == self.gen and self.forming:
            # Connects go one at a time: rank r gets the port once rank r-1
            # has joined (concurrent connects to one port crashed MPICH 5.0
            # in MPI_Comm_accept now and then).
            self.port = msg.get("port")
            self.joined.add(0)
            self._send_port(1)
        elif op == "joined" and msg.get("gen") == self.gen and self.forming:
            self.joined.add(w.rank)
            self._send_port(w.rank + 1)
        elif op == "formed" and msg.get("gen") == self.gen:
            w.formed = True
            if self.forming and all(m.formed for m in self.forming):
                self.members, self.forming = self.forming, []

    def _check_forming(self) -> None:
        """Note [A generation that does not form]: end the job, saying where
        the forming generation stopped, once it is past its deadline."""
        limit = max(self.timeout, FORM_TIMEOUT_FLOOR)
        if not self.forming or self.aborted or time.monotonic() - self.forming_since <= limit:
            return
        stuck = next((w for w in self.forming if w.rank not in self.joined), None)
        if stuck is None:
            where = ("every rank connected, but " + ", ".join(
                w.label() for w in self.forming if not w.formed) + " did not report the "
                "communicator formed (MPI_Intercomm_merge / MPI_Comm_split)")
        elif stuck.rank == 0:
            where = f"{stuck.label()} did not open its MPI port"
        else:
            where = (f"{stuck.label()} did not finish MPI_Comm_connect to rank 0's port "
                     f"(ranks 0-{stuck.rank - 1} wait in MPI_Comm_accept)")
        self._abort(f"generation {self.gen} did not form within {limit:g} s (--elastic-timeout, "
                    f"at least {FORM_TIMEOUT_FLOOR:g} s): {where}; MPI's connect and accept cannot "
                    "be interrupted, so its workers are stopped")

    def _send_port(self, rank: int) -> None:
        if rank < len(self.forming):
            self.forming[rank].send({"op": "port", "gen": self.gen, "port": self.port})
