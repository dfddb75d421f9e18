// background_loop.h — the communication thread. Each cycle: drain the
// submit queue, negotiate with the coordinator, plan fusion, execute the
// agreed responses in order, complete handles. It is the only thread that
// runs its engine's collectives (init() and add_process_set() create the
// communicators on the caller's thread; each process set has its own loop)
// (Note [Execution order] in coordinator.h says why order is safe).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <vector>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "config.h"
#include "coordinator.h"
#include "mpi_comm.h"
#include "response_executor.h"
#include "stats.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace gradflow {

// Note [Cycle pacing]
// A cycle is collective: every rank's loop joins the coordinator's readiness
// exchange, so a collective can start only once the *last* rank's loop
// enters a cycle after that rank submitted it. Hence:
//  * submit() wakes a sleeping loop at once (TensorQueue::submit), so the
//    usual case — all ranks submit at about the same time — costs one
//    exchange, not up to GRADFLOW_CYCLE_TIME of sleep;
//  * after a cycle that ran something the next starts immediately when
//    this rank has work queued or pending: more is usually behind it (the
//    rest of a backward pass) and the peers, just out of the same
//    collective, are in step. Tensors queued while a cycle runs are fused
//    by the next one, which is what batches a burst of small gradients.
//    When this rank has nothing, the loop first waits for its next submit
//    up to GRADFLOW_CYCLE_TIME (polling kLoopWakeSpin of it, Note [Short
//    spins], then asleep): no collective can be agreed without that
//    submit, and an exchange started at once would carry nothing from
//    this rank. In a series of synchronous calls every call cost two
//    exchanges, one of them empty (4 ranks on 2 cores: ~0.5 ms each); in
//    training, one empty exchange per cycle with work. Peers lose nothing:
//    what they wait for in their exchange is this rank's submit, and news
//    (a shutdown, an abort) waits at most one cycle time more;
//  * a cycle that ran nothing sleeps: GRADFLOW_CYCLE_TIME when this rank has
//    nothing pending (idle; submit wakes it), kPendingRecheck when it waits
//    for other ranks to submit what it already has, so it is back in the
//    exchange soon after they wake (bounded extra latency, bounded idle CPU:
//    never a busy loop of exchanges);
//  * idle backoff: each further idle cycle in a row doubles the idle sleep,
//    up to GRADFLOW_IDLE_CYCLE_MAX (20 ms). Every cycle is an exchange with
//    all peers, and in training most cycles are idle (the forward pass, the
//    optimizer step): at 1 ms they cost the loop ~25-40 ms of CPU per MLP
//    step on cores the compute needs (docs/performance.md, "Idle backoff of the coordination loop").
//    It adds no latency to collectives the idle rank will take part in:
//    taking part means submitting, and a submit wakes the loop at once; a
//    rank with anything pending (a join() included) is not idle. What may
//    wait up to the cap is news for a rank with nothing pending: a peer's
//    shutdown, abort or stall error.
constexpr std::chrono::microseconds kPendingRecheck{100};

class BackgroundLoop {
 public:
  BackgroundLoop(MpiComm& comm, const Config& cfg, TensorQueue& queue, Stats& stats,
                 Timeline& timeline);
  ~BackgroundLoop();

  // Called once on the loop thread when it dies of a communication failure
  // or an abort (with the reason), after its handles failed: the runtime
  // uses it to fail the process's other process-set engines too
  // (Note [Process sets], process_sets.h). Set before start().
  void set_fatal_listener(std::function<void(const std::string&)> f) { on_fatal_ = std::move(f); }
  // What the process's engines share (engine_links.h): the global engine's
  // loop (`owner`) keeps the join flag and watches for waits across engines
  // (Note [Waits across engines]); set engines read them. Set before start().
  void set_engine_links(std::shared_ptr<EngineLinks> links, bool owner) {
    links_ = links;
    owns_links_ = owner;
    coordinator_.set_engine_links(std::move(links), owner);
  }
  // A process set's engine writes its timeline rows as "<prefix><name>"
  // (Runtime: "set<id>/"), apart from the global set's. Before start().
  void set_timeline_rows(std::string prefix) { timeline_rows_ = std::move(prefix); }
  void start();
  // Asks every rank to stop at the next cycle and waits for the thread.
  void shutdown();
  // What this rank's pending collectives fail with when the agreed stop
  // comes (default: "shutdown() was called on rank R ...", naming the ranks
  // that called it). Before shutdown().
  void set_shutdown_reason(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_reason_ = reason;
  }
  // This rank is failing (exception, signal): the next cycle tells every
  // rank, whose pending and future collectives then raise `message`.
  void abort(const std::string& message);
  // Why the loop stopped, or "" while it runs.
  std::string failure() const;
  // True if the loop died of a communication failure (timeout, MPI error,
  // another rank's abort): MPI may be unusable, so MPI_Finalize could hang.
  bool failed_fatally() const { return fatal_; }
  // From another thread (gradflowrun's notice, a waiter, shutdown()): if the
  // loop thread is inside an MPI call without deadline (and, with
  // `overdue_only`, has been for GRADFLOW_TIMEOUT), give it up: the engine
  // fails fatally here and now, every handle with it, and the thread is left
  // behind (Note [Blocking MPI calls], mpi_comm.h). True if it did.
  bool give_up_if_blocked(bool overdue_only);
  // The loop thread was given up (it never ends; the runtime must outlive it).
  bool abandoned() const { return abandoned_; }

 private:
  void run();
  bool cycle();  // one tick; false when the loop must stop
  // Runs the cycle's agreed responses in order and completes their handles.
  void execute(const std::vector<Response>& responses);
  // What this rank tells the coordinator's bounded-wait check: a thread
  // waits on this engine (`blocked_here`), or, on the global engine, on any
  // engine of the process while nothing anywhere moves (Note [Waits across
  // engines], engine_links.h).
  bool blocked(bool blocked_here);
  void fail_all(const std::string& reason);
  // What the others' pending collectives fail with when `ranks` called
  // shutdown(). A process set's engine counts its members (its errors say
  // so in their prefix, Runtime::in_set_errors), as every set error does.
  std::string shutdown_message(const std::vector<int64_t>& ranks) const;
  // After an agreed autotune broadcast ran (tuning.h): apply its values.
  void apply_tuning(const Response& r, const TensorEntry& e, HandleResult* result);
  void trace_group(const std::vector<const Response*>& group,
                   const std::vector<TensorEntry*>& entries,
                   std::chrono::steady_clock::time_point started);

  MpiComm& comm_;
  Config cfg_;
  TensorQueue& queue_;
  Stats& stats_;
  Timeline& timeline_;  // EngineLinks::timeline, which links_ keeps alive
  std::string timeline_rows_;  // row-name prefix: "" (global set) or "set<id>/"
  Coordinator coordinator_;
  size_t stall_warnings_counted_ = 0;  // coordinator_.stall_warnings() already in stats_
  ResponseExecutor executor_;
  std::map<std::string, TensorEntry> pending_;  // this rank's submitted, not yet run
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> fatal_{false};
  std::atomic<bool> abandoned_{false};
  // Set as run()'s last act, so shutdown() can wait for it or give it up.
  std::mutex exit_mu_;
  std::condition_variable exit_cv_;
  bool exited_ = false;  // guarded by exit_mu_
  mutable std::mutex mu_;
  std::string shutdown_reason_;  // guarded by mu_
  std::string abort_message_;
  std::string failure_;
  std::thread thread_;
  std::function<void(const std::string&)> on_fatal_;
  std::shared_ptr<EngineLinks> links_;
  bool owns_links_ = false;
  uint64_t progress_seen_ = 0;  // links_->progress at this loop's previous cycle
  std::chrono::steady_clock::time_point agreed_at_;  // end of this cycle's negotiation
  int64_t cycles_with_work_ = 0;  // numbers the cycles in debug log lines
  int idle_cycles_ = 0;  // idle cycles in a row (Note [Cycle pacing], idle backoff)
};

}  // namespace gradflow
