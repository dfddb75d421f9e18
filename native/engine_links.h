// engine_links.h — the little state a process's engines (the global one and
// one per process set: Note [Process sets]) share. Plain atomics, no MPI:
// each engine's loop reads and writes them between its own collectives.
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
// no engine is executing agreed work, and no engine agreed anything since
// its previous cycle (`progress` did not move); it also says whether a
// thread waits on the global engine itself. When every rank has been
// blocked that way with nothing agreed for 1.5 x GRADFLOW_TIMEOUT, and not
// every rank waits on the global engine (that case stays Note [Bounded
// waits]'s: its names fail after GRADFLOW_TIMEOUT), rank 0 aborts the job,
// listing the global set's pending names: the whole job waits and nothing
// anywhere moves.
// Why abort rather than fail names, engine by engine: the engines' failures
// cannot be made to land together. A rank whose wait on one engine failed
// first could resubmit there, or submit on another engine, and complete a
// name its peers submitted before the deadlock, pairing data of different
// steps (seen in testing). Why 1.5 x: a set whose members all wait on it
// fails its names after GRADFLOW_TIMEOUT by itself (and that is progress);
// the job-wide abort comes only when that did not happen.
// Why the global engine and not each set alone: a set member blocked on
// another set whose member is busy computing (a straggler) is not
// deadlocked; only "every rank of the job blocked, nothing moving" is.
#pragma once

#include <atomic>
#include <cstdint>

namespace gradflow {

struct EngineLinks {
  // Note [Join and process sets] (coordinator.h): true while this process's
  // global join() is pending (written by the global engine, read by sets).
  std::atomic<bool> global_join{false};

  // Note [Waits across engines].
  std::atomic<int> waiting_threads{0};  // threads blocked in any engine's wait()
  std::atomic<int> executing{0};        // engines running agreed responses now
  std::atomic<uint64_t> progress{0};    // bumped by every cycle that agreed or ran something
};

}  // namespace gradflow
