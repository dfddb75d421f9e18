// tensor_queue.h — the hand-off between framework threads and the
// background loop: submitted entries (request + caller-owned buffers), the
// handle table that callers poll and wait on, and the in-flight name set
// that rejects a name submitted twice. Thread-safe; no MPI.
// Note [Handle lifetime]: a handle ends exactly once, by wait() (every thread
// waiting at that moment gets the result) or by release() (its owner dropped
// it: the result is discarded, now or when the core completes it). A released
// handle still in flight is reported by take_reaped() once it completes, so
// the binding knows when the caller's buffers are no longer touched.
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine_links.h"
#include "message.h"

namespace gradflow {

class SparseResidual;
class PoolResidual;

// One submitted collective on this rank. Buffers belong to the caller, who
// keeps them alive until the handle completes (gradflow/_handles.py does).
struct TensorEntry {
  Request request;
  const void* input = nullptr;  // may equal output (in place)
  void* output = nullptr;       // null for allgather / alltoall (core allocates)
  int64_t handle = -1;
  std::chrono::steady_clock::time_point submitted;
  // A sparse pool bucket's error-feedback residual, owned with its pool:
  // the entry's reference keeps it alive while the bucket is in flight.
  std::shared_ptr<SparseResidual> sparse_residual;
  // Instead, a sparse pool bucket whose residual is the pool itself (input
  // P; the result goes to output G): its bookkeeping, owned with its pool.
  std::shared_ptr<PoolResidual> pool_residual;
  // A named sparse allreduce (the optimizer's copy path): undo the residual's
  // last commit before this step absorbs (a step the optimizer skipped;
  // SparseResidual::rollback). Local: every rank asks alike.
  bool rollback_residual = false;
};

// What a finished handle yields.
struct HandleResult {
  std::string error;                      // non-empty: the collective failed
  std::shared_ptr<std::vector<uint8_t>> data;  // allgather / alltoall output
  std::vector<int64_t> shape;             // shape of `data`
  std::vector<int64_t> recv_splits;       // alltoall: rows received per rank
  bool wire_overflow = false;             // a value overflowed the 16-bit wire
  // The error is the same on every rank: the coordinator's decision (a
  // mismatch, a bounded wait) or an agreed response that failed alike
  // everywhere. Python marks the GradflowError `job_wide`, so gradflowrun
  // blames no rank for it (runner/supervise.py).
  bool agreed = false;
};

// Note [Short spins]
// A synchronous small collective is two thread hand-offs on each rank: the
// submit wakes the background loop, the completion wakes the caller. Each
// is a futex sleep and wake, and the woken thread may first wait for its
// core to come out of idle: on this (virtual) machine the two cost most of
// a 4 KiB allreduce's time (one rank, 4 KiB, back-to-back calls: 57 us per
// call with plain sleeps, 14 us with these polls; docs/performance.md). So
// both sleepers first poll a lock-free counter for a short while, yielding
// the core between polls (never a hot loop that starves a thread of a peer
// rank sharing the core):
//  * wait() polls up to kWaitSpin for a completion before it blocks: a small
//    collective completes within that, a large one does not and the caller
//    then sleeps as before (bounded, not a busy wait);
//  * the loop, after a cycle that ran work and left this rank nothing
//    pending, waits for the next submit before its next exchange
//    (BackgroundLoop::cycle, Note [Cycle pacing]) and polls the first
//    kLoopWakeSpin of that wait: in a series of calls the next one arrives
//    within microseconds. Only that one poll per cycle with work, so an
//    idle loop costs no CPU, and in training it is a few polls per step.
constexpr std::chrono::microseconds kWaitSpin{50};
constexpr std::chrono::microseconds kLoopWakeSpin{100};
// How often a long wait asks whether its caller was interrupted.
constexpr std::chrono::milliseconds kInterruptCheck{100};

class TensorQueue {
 public:
  // Registers a handle and queues the entry. Throws GradflowError if the
  // queue is closed, and (a ValueError) if a call under the name is already
  // in flight or held on this rank. An entry with `request.withdrawn` has no
  // buffers and no caller: its handle is never waited on and its completion
  // is dropped (Note [Withdrawn names], coordinator.h). An entry whose name
  // is in flight here (a call after a withdrawal, a withdrawal after a call)
  // is held and queued, in order, when the one before it completes (Note
  // [Withdrawing a name in flight], tensor_queue.cc).
  int64_t submit(TensorEntry entry);
  // Moves every queued entry to the caller (the background loop).
  std::vector<TensorEntry> drain();

  // Marks a handle done; wakes waiters. Frees the name for reuse.
  void complete(const TensorEntry& entry, HandleResult result);
  bool poll(int64_t handle);
  // Blocks until done and returns its result. Every thread waiting on the
  // handle gets the result; the handle is forgotten when the last one returns.
  // `interrupted` (optional) is asked every kInterruptCheck while the
  // handle is not done (without the queue's lock, the caller still counted
  // as waiting); when it says true, the wait ends without a result (nullopt)
  // and the handle stays in flight, to be waited again or released (Ctrl-C
  // in a Python wait: python_module.cc).
  std::optional<HandleResult> wait(int64_t handle,
                                   const std::function<bool()>& interrupted = nullptr);
  // Whether some thread is blocked in wait() now (the coordinator's
  // deadlock check: every rank blocked, nothing can complete).
  bool someone_waits() const;
  // Waits are also counted in `links->waiting_threads`, shared by the
  // process's engines (Note [Waits across engines], engine_links.h).
  // Before the first wait().
  void set_engine_links(std::shared_ptr<EngineLinks> links) { links_ = std::move(links); }
  // Whether a handle is still in flight or holds a result nobody waited for.
  bool holds_handles() const;
  // The caller dropped the handle: forget its result (now, or on completion).
  // Returns true if the core no longer touches its buffers (done or unknown),
  // false if it is still in flight (take_reaped() reports it later).
  bool release(int64_t handle);
  // Released handles that have completed since the last call.
  std::vector<int64_t> take_reaped();

  // After a fatal error or shutdown: every queued and future submit fails
  // with `reason`; returns the entries still queued so the caller can fail them.
  std::vector<TensorEntry> close(const std::string& reason);
  // close(), and from a thread other than the loop's, whose own thread was
  // given up inside MPI (Note [Blocking MPI calls], mpi_comm.h) and will
  // complete nothing: every in-flight handle now fails with `reason`.
  // Released handles are reaped: nothing touches their buffers any more.
  void fail_in_flight(const std::string& reason);
  bool closed() const;
  std::string close_reason() const;
  // Wakes the background loop early (used by shutdown).
  void notify();
  // Background loop sleeps here until `deadline` or notify(). With `spin`
  // > 0 it first polls for a submit that long (Note [Short spins]).
  void sleep_until(std::chrono::steady_clock::time_point deadline,
                   std::chrono::microseconds spin = std::chrono::microseconds(0));

 private:
  std::shared_ptr<EngineLinks> links_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::condition_variable wake_cv_;
  std::deque<TensorEntry> queue_;
  std::map<int64_t, std::shared_ptr<HandleResult>> finished_;
  std::map<int64_t, int> waiters_;       // threads blocked in wait(handle)
  std::set<int64_t> in_flight_handles_;
  std::set<int64_t> released_;           // released while in flight
  std::vector<int64_t> reaped_;          // released, since completed
  std::set<std::string> in_flight_names_;  // an entry queued or with the core
  std::set<std::string> withdrawn_names_;  // ... and that entry is a withdrawal (no handle)
  // Entries submitted while their name was in flight, in order, each queued
  // when the one before it completes (Note [Withdrawing a name in flight],
  // tensor_queue.cc): a call behind a withdrawal, a withdrawal behind a call.
  std::map<std::string, std::deque<TensorEntry>> held_;
  // Queues an entry, marks its name in flight and counts a wake (under mu_;
  // the caller notifies wake_cv_ after).
  void queue_locked(TensorEntry entry);
  bool closed_ = false;
  std::string close_reason_;
  // Bumped under mu_ by every complete() (completions_) and every submit()
  // and notify() (wakes_); the short spins read them without it.
  std::atomic<uint64_t> completions_{0};
  std::atomic<uint64_t> wakes_{0};
  // wakes_ when the loop last took its wake (drain() or the end of
  // sleep_until(), both under mu_; the loop thread's own). The loop has a
  // wake pending exactly when wakes_ differs from it.
  uint64_t wakes_taken_ = 0;
};

}  // namespace gradflow
