// rma_window.cc — MPI one-sided windows for the two-sync allreduce: a
// passive-target window (MPI_Win_allocate) or, when every rank shares a node,
// a shared-memory window (MPI_Win_allocate_shared) whose peers' memory is
// read with plain loads. Owns nothing but the window; waits go through the
// owning MpiComm so they keep its deadline.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "mpi_internal.h"

namespace gradflow {

namespace {

// A passive-target window locked (lock_all) for its whole lifetime; sync() is
// the "synchronization" of the two-sync allreduce: win_sync, barrier with
// deadline, win_sync (the standard shared-memory pattern in the unified
// memory model, which keeps our deadline unlike MPI_Win_fence).
class MpiWindow : public RmaWindow {
 public:
  MpiWindow(MpiComm& owner, MPI_Comm comm, size_t bytes, bool shared)
      : owner_(owner), shared_(shared), bytes_(bytes) {
    const char* what = shared ? "MPI_Win_allocate_shared" : "MPI_Win_allocate";
    GF_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<MPI_Aint>::max()),
             "gradflow: window of " << bytes << " bytes is too large");
    int size = 0;
    MPI_Comm_size(comm, &size);
    MPI_Info info;
    MPI_Info_create(&info);
    if (shared) MPI_Info_set(info, "alloc_shared_noncontig", "true");
    MPI_Aint n = static_cast<MPI_Aint>(bytes);
    int rc;
    {
      // No deadline inside: Note [Blocking MPI calls] (mpi_comm.h).
      const char* call = shared ? "MPI_Win_allocate_shared (two-sync window creation)"
                                : "MPI_Win_allocate (two-sync window creation)";
      BlockingCall blocking(owner, call);
      if (blocking.stopped()) {
        MPI_Info_free(&info);
        owner.mark_broken();
        throw TransportError(timeout_message(owner.timeout_seconds(), call, "the other ranks"));
      }
      rc = shared ? MPI_Win_allocate_shared(n, 1, info, comm, &base_, &win_)
                  : MPI_Win_allocate(n, 1, info, comm, &base_, &win_);
    }
    MPI_Info_free(&info);
    mpi_check(rc, what, "create_window");
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    if (shared) {
      peers_.resize(size, nullptr);
      for (int p = 0; p < size; ++p) {
        MPI_Aint sz = 0;
        int disp = 0;
        mpi_check(MPI_Win_shared_query(win_, p, &sz, &disp, &peers_[p]), "MPI_Win_shared_query",
                  "create_window");
      }
    }
    mpi_check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all", "create_window");
  }
  ~MpiWindow() override {
    // Note [Collective destruction] (mpi_comm.h): MPI_Win_free waits for every
    // rank; after a communication failure the window is leaked instead.
    if (mpi_finalized() || owner_.broken()) return;
    MPI_Win_unlock_all(win_);
    BlockingCall blocking(owner_, "MPI_Win_free (two-sync window release)");
    if (!blocking.stopped()) MPI_Win_free(&win_);  // else leaked: a peer is dead
  }
  void* local_base() override { return base_; }
  size_t bytes() const override { return bytes_; }
  void* peer_base(int rank) override { return shared_ ? peers_.at(rank) : nullptr; }
  bool is_shared() const override { return shared_; }
  void sync(const char* what) override {
    if (!shared_) flush();
    mpi_check(MPI_Win_sync(win_), "MPI_Win_sync", what);
    dissemination_barrier(what);
    mpi_check(MPI_Win_sync(win_), "MPI_Win_sync", what);
  }
  void get(void* dst, size_t bytes, int rank, size_t offset) override {
    if (shared_) {  // plain loads; complete at once
      std::memcpy(dst, static_cast<char*>(peers_.at(rank)) + offset, bytes);
      return;
    }
    for (size_t d = 0; d < bytes; d += kMaxCount) {
      int c = static_cast<int>(std::min(kMaxCount, bytes - d));
      mpi_check(MPI_Get(static_cast<char*>(dst) + d, c, MPI_BYTE, rank,
                        static_cast<MPI_Aint>(offset + d), c, MPI_BYTE, win_),
                "MPI_Get", "window get");
    }
  }
  void flush() override {
    if (!shared_) mpi_check(MPI_Win_flush_all(win_), "MPI_Win_flush_all", "window flush");
  }

 private:
  // ceil(log2 N) rounds of zero-byte messages (round k: to rank r+k, from
  // r-k). sync() runs twice per two-sync allreduce and is most of its cost on
  // small messages; in MPICH such a point-to-point exchange completes sooner
  // than MPI_Ibarrier's schedule, and a timeout names the peer. Messages of
  // successive barriers cannot be confused: MPI keeps order per (source,
  // tag), and a rank starts barrier b+1 only after receiving all of b's.
  void dissemination_barrier(const char* what) {
    const int n = owner_.size(), r = owner_.rank();
    char out = 0, in = 0;
    for (int k = 1; k < n; k *= 2) {
      RequestList reqs;
      owner_.irecv(&in, 0, (r - k + n) % n, kTagTwoSync, reqs);
      owner_.isend(&out, 0, (r + k) % n, kTagTwoSync, reqs);
      owner_.wait_all(reqs, what, WaitStyle::kData);  // mid-collective: peers are close
    }
  }

  MpiComm& owner_;
  bool shared_;
  size_t bytes_;
  void* base_ = nullptr;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<void*> peers_;
};

}  // namespace

std::unique_ptr<RmaWindow> make_mpi_window(MpiComm& owner, MPI_Comm comm, size_t bytes,
                                           bool shared) {
  return std::unique_ptr<RmaWindow>(new MpiWindow(owner, comm, bytes, shared));
}

}  // namespace gradflow
