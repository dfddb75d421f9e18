// mpi_internal.h — helpers shared by the transport files that include mpi.h
// (mpi_comm.cc: communicator, waits, point-to-point;
// mpi_control_collectives.cc: barrier, small allreduces, negotiation's
// broadcast and gather; mpi_data_collectives.cc: bcast / allgatherv /
// alltoallv; rma_window.cc: one-sided windows). Never included by algorithm
// or binding code.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mpi_comm.h"

namespace gradflow {

// Largest count handed to one MPI call. Overridable at build time so tests can
// exercise the chunked (> INT_MAX) paths with small buffers.
#ifndef GRADFLOW_MAX_MPI_COUNT
#define GRADFLOW_MAX_MPI_COUNT (size_t{1} << 30)
#endif
inline constexpr size_t kMaxCount = GRADFLOW_MAX_MPI_COUNT;
static_assert(kMaxCount <= size_t{INT_MAX}, "MPI counts are int");

inline bool mpi_finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

// Turns an MPI error code into a TransportError naming the call and the
// operation it served.
inline void mpi_check(int rc, const char* call, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(std::string("gradflow: ") + call + " failed in " + what + ": " +
                      std::string(text, static_cast<size_t>(len)));
}

// Set by interrupt_waits() and cleared by clear_interrupt() (mpi_comm.cc,
// with the reason); every poll reads it.
inline std::atomic<bool> g_waits_interrupted{false};

// Polls `done` until it returns true or the deadline passes. MPICH moves data
// only inside MPI calls, so a wait first tests back to back (yielding the core
// between tests so oversubscribed ranks still run), then sleeps between tests
// with a growing gap so that a long wait — a slow network, a peer still
// computing its backward pass — does not take the core from this rank's own
// compute thread. kData waits (peers are transferring right now) spin longer
// and cap the gap lower than kControl waits (negotiation, barriers), which can
// last seconds. Sleeps are precise because the background thread sets its
// timer slack to 1 us (BackgroundLoop::run).
template <typename Done>
bool poll_until(std::chrono::steady_clock::time_point deadline, WaitStyle style, Done done) {
  using Clock = std::chrono::steady_clock;
  using us = std::chrono::microseconds;
  const bool data = style == WaitStyle::kData;
  const us spin_for = data ? us(1000) : us(50);
  const us max_gap = data ? us(100) : us(250);
  const auto start = Clock::now();
  us gap(5);
  for (int spins = 0;; ++spins) {
    if (done()) return true;
    if (spins < 16) continue;
    auto now = Clock::now();
    if (now >= deadline || g_waits_interrupted.load(std::memory_order_relaxed)) return done();
    if (now - start < spin_for) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(gap);
      gap = std::min(max_gap, gap * 2);
    }
  }
}

// The TransportError text of a wait that ran out: the deadline passed, or
// interrupt_waits() ended it (then with its reason). `whom`: what it waited for.
std::string timeout_message(double timeout_s, const char* what, const std::string& whom);
// "rank 3" / "ranks 1, 2", for error messages.
std::string rank_list(const std::vector<int>& ranks);

// Note [Abandoned operations]
// A wait that fails (deadline, interrupt_waits, MPI error) leaves its
// operation inside MPI: a nonblocking collective can be neither cancelled nor
// freed (MPI 3.1, 5.12), and a receive that MPI already matched goes on. MPI
// may complete it later, in any MPI call of any thread of this process, once
// a peer that was merely late takes part: a live member of a process set
// whose engine stops after this rank's engine failed (its shutdown cycle
// joins the bit-vector allreduce this rank gave up on), or a rank not yet
// told of a death. MPI then writes into the operation's buffer. The buffers
// of the control collectives (negotiation) were locals of the caller, freed
// on unwinding: the late write corrupted the heap of a survivor
// (test_process_sets.py::test_failure_under_gradflowrun_default_settings
// [dead], 2 runs in 150: "free(): corrupted unsorted chunks", SIGSEGV; or a
// hang). So control collectives run on a ControlCopy, which a failed wait
// leaves to MPI for good (never freed: the process is ending), and gather's
// matched receives keep their buffers. Data collectives (the mpi algorithm,
// allgather, ...) and the algorithms' point-to-point receives still run on
// the caller's memory: copying every data buffer would cost the data path,
// and there a late write needs a live peer still sending to a rank that
// already failed.
class ControlCopy {
 public:
  ControlCopy(void* data, size_t bytes)
      : data_(data), bytes_(bytes), copy_(new uint8_t[bytes > 0 ? bytes : 1]) {
    if (bytes > 0) std::memcpy(copy_, data, bytes);
  }
  ControlCopy(const ControlCopy&) = delete;
  ControlCopy& operator=(const ControlCopy&) = delete;
  // Not freed unless commit() ran: the operation was abandoned.
  ~ControlCopy() = default;
  uint8_t* get() { return copy_; }
  // The operation completed: its result back to the caller's memory.
  void commit() {
    if (bytes_ > 0) std::memcpy(data_, copy_, bytes_);
    delete[] copy_;
    copy_ = nullptr;
  }

 private:
  void* data_;
  size_t bytes_;
  uint8_t* copy_;
};

// Note [Blocking MPI calls] (mpi_comm.h). phase: 0 idle, 1 inside the call,
// 2 given up (by another thread; for good). `since` in steady-clock ticks.
struct MpiComm::BlockingCallState {
  std::atomic<int> phase{0};
  std::atomic<const char*> what{nullptr};
  std::atomic<int64_t> since{0};
};

// Marks the scope of an MPI call without a deadline, on the thread that
// makes it. If another thread gave the call up meanwhile, the destructor
// never returns: the thread sleeps for good (Note [Blocking MPI calls]), so
// it is safe in destructors (MPI_Win_free) and needs no throw.
class BlockingCall {
 public:
  BlockingCall(MpiComm& comm, const char* what) : state_(comm.blocking_) {
    state_->what.store(what);
    state_->since.store(std::chrono::steady_clock::now().time_since_epoch().count());
    state_->phase.store(1);
    // A dead peer's news that came just before: interrupt_waits() sets the
    // flag and then looks for a call to give up, this marks the call and
    // then reads the flag (both seq_cst), so one of the two sees the other.
    // Then the call must not be made (stopped() says so).
    if (!g_waits_interrupted.load()) return;
    int inside = 1;
    if (!state_->phase.compare_exchange_strong(inside, 0)) park();  // given up already
    stopped_ = true;
  }
  // The call must not be made: a peer is known dead (interrupt_waits).
  bool stopped() const { return stopped_; }
  ~BlockingCall() {
    if (stopped_) return;
    int inside = 1;
    if (state_->phase.compare_exchange_strong(inside, 0)) return;
    park();
  }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  [[noreturn]] static void park() {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  std::shared_ptr<MpiComm::BlockingCallState> state_;
  bool stopped_ = false;
};

// What MpiComm hides from its header: the MPI communicator itself.
struct MpiComm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  void iallreduce(MpiComm& self, void* buf, size_t count, size_t elem_bytes, MPI_Datatype t,
                  MPI_Op op, const char* what, WaitStyle style);
  std::chrono::steady_clock::time_point deadline(double timeout_s) const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(timeout_s));
  }
};

// A window of `bytes` on `comm` (collective over comm; see rma_window.cc).
// `owner` provides the deadline barrier used by RmaWindow::sync.
std::unique_ptr<RmaWindow> make_mpi_window(MpiComm& owner, MPI_Comm comm, size_t bytes,
                                           bool shared);

}  // namespace gradflow
