// mpi_comm.h — the transport seam (mpi.h itself is included only by
// mpi_comm.cc, rma_window.cc and mpi_internal.h, never by this header).
// Owns a private duplicate of the user's communicator, point-to-point
// requests, small control collectives and RMA windows. Every wait has a
// deadline (GRADFLOW_TIMEOUT) so a dead or stalled peer becomes a
// GradflowError instead of a hang. Knows nothing about tensors or algorithms.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"

namespace gradflow {

// A communication failure (TransportError, common.h: a deadline passed — a
// peer died, stalled or never arrived — or MPI reported an error while
// waiting) leaves the MpiComm broken(): MPI objects whose destruction is
// collective are leaked, not freed.

// A growable list of outstanding MPI requests. The MPI_Request storage is
// hidden so that algorithm headers never see mpi.h.
class RequestList {
 public:
  RequestList();
  ~RequestList();
  RequestList(const RequestList&) = delete;
  RequestList& operator=(const RequestList&) = delete;
  size_t size() const;
  void clear();  // only valid once every request has completed

 private:
  friend class MpiComm;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-sided window for the two-sync allreduce. With `shared` (all ranks on
// one node) peer memory is directly addressable through peer_base().
class RmaWindow {
 public:
  virtual ~RmaWindow() = default;
  virtual void* local_base() = 0;
  virtual size_t bytes() const = 0;
  // Non-null only for shared-memory windows.
  virtual void* peer_base(int rank) = 0;
  virtual bool is_shared() const = 0;
  // Completes all outstanding RMA and synchronizes all ranks (memory
  // barrier + barrier with deadline). This is one "synchronization".
  virtual void sync(const char* what) = 0;
  // Read `bytes` at `offset` of `rank`'s window into `dst`; complete at the
  // next sync() or flush().
  virtual void get(void* dst, size_t bytes, int rank, size_t offset) = 0;
  virtual void flush() = 0;
};

// How a wait spends the time between MPI_Test calls (see poll_until).
// kData: the peers are transferring right now, keep driving MPI's progress.
// kControl: a peer may still be computing (negotiation, barriers), so back
// off to short sleeps quickly instead of taking the core from it.
enum class WaitStyle { kData, kControl };

class MpiComm {
 public:
  // `comm_handle` is an MPI_Comm converted to an integer (mpi4py's
  // MPI.Comm.handle) or 0 for MPI_COMM_WORLD. The communicator is duplicated
  // so gradflow's traffic never matches the user's messages. Every rank of
  // the communicator must construct one within the timeout (TransportError
  // otherwise: a rank exited or is stuck before init).
  MpiComm(uintptr_t comm_handle, double timeout_seconds);
  ~MpiComm();  // release_communicator()

  // Note [Collective destruction]: freeing a window (MPI_Win_free) waits for
  // every rank, without a deadline. After a communication failure a peer may
  // be dead, so once broken() nothing collective is freed: the objects are
  // leaked and the job, which is ending, does not hang at exit.
  void mark_broken() { broken_ = true; }
  bool broken() const { return broken_; }
  // Frees the duplicate communicator (unless broken or MPI is finalized).
  // Idempotent; after it only rank()/size()/... may be used.
  void release_communicator();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  bool all_on_one_node() const { return local_size_ == size_; }
  // Shared-memory windows (MPI_Win_allocate_shared) are possible: every rank
  // on one node and of one MPI_COMM_WORLD. Workers of an elastic job (each
  // its own mpiexec, joined by connect/accept) share a node by
  // MPI_COMM_TYPE_SHARED, but MPICH refuses them a shared window ("processes
  // are not in the same shared memory domain"): the two-sync allreduce failed
  // on every generation. Agreed by all ranks at construction.
  bool shared_windows() const { return all_on_one_node() && one_world_; }
  // Every node runs the same number of ranks (Horovod's is_homogeneous);
  // agreed by all ranks at construction.
  bool homogeneous() const { return homogeneous_; }
  double timeout_seconds() const { return timeout_s_; }

  // ---- point to point (bytes <= INT_MAX per call) ----
  size_t isend(const void* buf, size_t bytes, int dest, int tag, RequestList& reqs);
  size_t irecv(void* buf, size_t bytes, int src, int tag, RequestList& reqs);
  // Wait for one request of the list; `what` names the operation in errors.
  void wait(RequestList& reqs, size_t index, const char* what);
  void wait_all(RequestList& reqs, const char* what, WaitStyle style = WaitStyle::kData);

  // ---- control collectives (all with deadline) ----
  void barrier(const char* what, WaitStyle style = WaitStyle::kControl);
  // Element-wise bitwise AND of `n` words across all ranks, in place.
  void allreduce_band(uint64_t* words, size_t n, const char* what);
  void allreduce_max_i64(int64_t* values, size_t n, const char* what);
  // Root's bytes replace everyone's `data` (resized on non-roots).
  void bcast_vector(std::vector<uint8_t>& data, int root, const char* what);
  // Every rank sends `mine` to `root`; root gets one vector per rank.
  // Ranks whose message did not arrive by the deadline are listed in the
  // exception message.
  std::vector<std::vector<uint8_t>> gather_to_root(const std::vector<uint8_t>& mine, int root,
                                                   const char* what);

  // ---- data collectives used by collectives.cc (byte granularity) ----
  void bcast(void* buf, size_t bytes, int root, const char* what);
  void allgatherv(const void* send, size_t send_bytes, void* recv,
                  const std::vector<size_t>& recv_bytes, const char* what);
  // `largest_total` is the largest send or receive total of any rank, the
  // same number on every rank: it alone picks MPI's alltoallv or the
  // point-to-point fallback, so no two ranks post different protocols.
  void alltoallv(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                 const std::vector<size_t>& recv_bytes, size_t largest_total, const char* what);
  // MPI_Allreduce on the builtin types (float32/64, int32/64, uint8); the
  // "mpi" algorithm and the baseline for benchmarks. Throws for fp16/bf16.
  void allreduce_builtin(void* buf, size_t count, DataType dt, ReduceOp op, const char* what);

  // ---- RMA ----
  std::unique_ptr<RmaWindow> create_window(size_t bytes, bool prefer_shared);

  // Note [Blocking MPI calls]
  // Creating a window (MPI_Win_allocate[_shared]) and freeing one
  // (MPI_Win_free) are collective calls with no deadline. A deadline barrier
  // comes first, but a peer killed after it and before its part of the call
  // left the other ranks' loop threads inside MPI for ever, where no poll can
  // see gradflowrun's notice or GRADFLOW_TIMEOUT: their waiters hung until
  // gradflowrun's grace period killed them (Open MPI CI,
  // test_sigkill_stops_the_job_within_seconds[3-1-mid-two-sync]; MPICH, a
  // kill 20 ms after the submit: 3 runs in 4). So such a call is marked
  // (BlockingCall, mpi_internal.h) and another thread may give it up: with
  // the news of a dead peer (interrupt_waits, gradflowrun's notice) or once
  // it has lasted GRADFLOW_TIMEOUT (`overdue_only`). Giving up marks the
  // communicator broken and returns the error text (TransportError's words,
  // naming the call); "" when no such call is running, or it is not overdue.
  // The thread stays where it is: if MPI ever returns, it parks for good
  // without touching anything (the runtime has failed; buffers its caller
  // passed may be gone). Its engine then fails every handle from the giving
  // thread and shutdown() leaves the thread behind (BackgroundLoop::abandon).
  std::string abandon_blocking_call(bool overdue_only);
  bool abandoned() const;
  struct BlockingCallState;  // mpi_internal.h

  // Library version string of the linked MPI.
  static std::string library_version();
  // The MPI whose mpi.h this build was compiled with, e.g. "MPICH 5.0.2" or
  // "Open MPI 4.1.4" (vendor names as mpi4py's MPI.get_vendor() gives them),
  // so --check-build can compare it with mpi4py's.
  static std::string built_with();

 private:
  void wait_request(void* request, const char* what, int peer, WaitStyle style);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  bool homogeneous_ = true;
  bool one_world_ = true;
  double timeout_s_ = 60.0;
  std::atomic<bool> broken_{false};
  friend class BlockingCall;
  // Shared with a running BlockingCall, which may outlive this object (a
  // thread left inside MPI after the runtime was released).
  std::shared_ptr<BlockingCallState> blocking_;
};

// Tags used by gradflow's own traffic on its private communicator.
enum CommTag : int {
  kTagNegotiate = 1,
  kTagRing = 2,
  kTagGather = 3,
  kTagTwoSync = 4,
  kTagCollective = 5,
  kTagAdasum = 6,
  kTagRecursiveDoubling = 7,
  kTagHalvingDoubling = 8,
};

// A new communicator of `ranks` (ranks of the communicator `parent_handle`,
// 0 = MPI_COMM_WORLD), for a process set's engine (process_sets.cc). Only
// the listed ranks call it (MPI_Comm_create_group, told apart by `tag`); it
// blocks without a deadline, so callers first agree that every listed rank
// is here. Returns the handle in mpi4py's form, for MpiComm's constructor
// (which duplicates it); free it with free_communicator_handle.
uintptr_t create_group_communicator(uintptr_t parent_handle, const std::vector<int>& ranks,
                                    int tag);
void free_communicator_handle(uintptr_t handle);

// Process-wide: every deadline-polled wait (now and later, in any runtime)
// ends at once with GradflowError naming `why`. For news that a peer is gone
// for good (gradflowrun saw it die), which otherwise costs GRADFLOW_TIMEOUT.
// Thread-safe; the first reason is kept.
void interrupt_waits(const std::string& why);
// Undo interrupt_waits() for the next runtime (elastic training re-forms the
// communicator after a peer died); only while no runtime exists.
void clear_interrupt();
// Some thread of this process was given up inside an MPI call without
// deadline (Note [Blocking MPI calls]) and may still run inside MPI, on a
// communicator of a runtime long shut down (elastic training re-forms and
// finishes after it). MPI_Finalize must not run then: it tore MPI down under
// that thread (MPICH/UCX: SIGSEGV at exit of both survivors of a worker
// SIGKILLed inside MPI_Win_allocate, after they had finished training).
bool threads_left_inside_mpi();

}  // namespace gradflow
