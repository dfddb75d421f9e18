// engine_links.h — the little state a process's engines (the global one and
// one per process set: Note [Process sets]) share. Atomics and rank 0's
// timeline, no MPI: each engine's loop uses them between its own collectives.
//
// Note [Waits across engines]
// Each engine bounds its own waits (Note [Bounded waits], coordinator.h):
// when every member is blocked in wait() *on that engine* and nothing is
// agreed for GRADFLOW_TIMEOUT, its pending names fail. A wait cycle through
// two engines escapes that: rank 0 waits on the global set for a name rank 1
// has not submitted, because rank 1 waits on process set {0, 1} for a name
// rank 0 has not submitted (collectives of two sets called in different
// orders; overlapping sets' DistributedOptimizers whose backward passes run
// in different orders). Neither engine sees all its members blocked on it,
// so before this the job hung for ever (only GRADFLOW_STALL_SHUTDOWN_TIME
// ended it).
// Now the global engine, which spans every rank, tells its coordinator a
// rank is blocked when some thread of the process waits on *any* engine,
// no engine is executing agreed work, and nothing moved since its previous
// cycle (`progress`: bumped when any engine finishes running agreed
// responses, and when any wait begins). Its coordinator keeps that spell
// beside Note [Bounded waits]'s own (every rank waiting on the global
// engine itself, unchanged). When every rank has been so blocked for 1.5 x
// GRADFLOW_TIMEOUT, and not all on the global engine, rank 0 aborts the
// job, listing the global set's pending names; only if that very cycle
// still finds every rank blocked and agrees nothing.
// Why abort rather than fail names, engine by engine: the engines' failures
// cannot be made to land together. A rank whose wait on one engine failed
// first could resubmit there, or submit on another engine, and complete a
// name its peers submitted before the deadlock, pairing data of different
// steps (seen in testing). Why 1.5 x, and why a wait that begins counts as
// movement: the job's spell then starts after the last wait anywhere,
// never before a set's own spell (which starts at its last member's wait),
// so a set whose members all wait on it fails its names after
// GRADFLOW_TIMEOUT by itself, first; the job-wide abort comes only when
// that did not happen.
// Why the global engine and not each set alone: a set member blocked on
// another set whose member is busy computing (a straggler) is not
// deadlocked; only "every rank of the job blocked, nothing moving" is.
// The approximation Note [Bounded waits] already makes holds here too: a
// rank counts as blocked while any of its threads waits, even if another
// thread computes; a program whose every rank keeps a thread waiting on a
// collective that another thread will complete only after more than 1.5 x
// GRADFLOW_TIMEOUT of computing is taken for a deadlock.
#pragma once

#include <atomic>
#include <cstdint>

#include "timeline.h"

namespace gradflow {

struct EngineLinks {
  // Note [Join and process sets] (coordinator.h): true while this process's
  // global join() is pending (written by the global engine, read by sets).
  std::atomic<bool> global_join{false};

  // Note [Waits across engines].
  std::atomic<int> waiting_threads{0};  // threads blocked in any engine's wait()
  std::atomic<int> executing{0};        // engines running agreed responses now
  std::atomic<uint64_t> progress{0};    // bumped when agreed work ends or a wait begins

  // The timeline (rank 0 writes it): the global engine opens and closes it
  // (init, start/stop_timeline, shutdown); set engines write their spans to
  // it too, on rows "set<id>/<name>", so the sets rank 0 belongs to appear.
  // Here rather than in the global Runtime so that no engine outlives it (a
  // removed set's engine kept for its handles, an old engine after an
  // elastic reset): every engine holds these links. A closed one ignores writes.
  Timeline timeline;
};

}  // namespace gradflow
