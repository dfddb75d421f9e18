// mpi_comm.cc — the transport seam (with mpi_control_collectives.cc,
// mpi_data_collectives.cc and rma_window.cc, the only users of mpi.h). Owns
// the private duplicate communicator, deadline-polled waits and
// point-to-point (nonblocking MPI, so every wait can time out) and the
// creation of RMA windows. Knows nothing about tensors, algorithms or
// configuration.
#include "mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <atomic>
#include <limits>
#include <mutex>
#include <thread>
#include <type_traits>

#include "mpi_internal.h"

namespace gradflow {

namespace {

// interrupt_waits(): the flag (g_waits_interrupted, mpi_internal.h) is read
// in every poll, the reason only after.
std::mutex g_interrupt_mu;
std::string g_interrupt_why;

// mpi4py's comm.handle is the MPI_Comm value as an integer; MPICH's MPI_Comm
// is an int, the standard ABI's (and Open MPI's) is a pointer.
template <typename C>
C comm_from_handle(uintptr_t h) {
  if constexpr (std::is_integral<C>::value) {
    return static_cast<C>(h);
  } else {
    static_assert(std::is_pointer<C>::value, "MPI_Comm is neither integer nor pointer");
    return reinterpret_cast<C>(h);
  }
}

template <typename C>
uintptr_t handle_from_comm(C c) {
  if constexpr (std::is_integral<C>::value) {
    return static_cast<uintptr_t>(c);
  } else {
    return reinterpret_cast<uintptr_t>(c);
  }
}

}  // namespace

std::string timeout_message(double timeout_s, const char* what, const std::string& whom) {
  std::ostringstream os;
  if (g_waits_interrupted.load()) {
    std::lock_guard<std::mutex> lock(g_interrupt_mu);
    os << "gradflow: stopped waiting for " << whom << " in " << what << ": " << g_interrupt_why;
    return os.str();
  }
  os << "gradflow: timed out after " << timeout_s << " s in " << what << " waiting for " << whom
     << "; a rank may have died or stalled (GRADFLOW_TIMEOUT sets the limit)";
  return os.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

void interrupt_waits(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(g_interrupt_mu);
    if (!g_waits_interrupted.load()) g_interrupt_why = why.empty() ? "interrupted" : why;
  }
  g_waits_interrupted.store(true);
}

void clear_interrupt() {
  std::lock_guard<std::mutex> lock(g_interrupt_mu);
  g_interrupt_why.clear();
  g_waits_interrupted.store(false);
}

// ---------------------------------------------------------------- requests

struct RequestList::Impl {
  struct Pending {
    MPI_Request req;
    int peer;     // for error messages
    bool is_recv;  // receives are cancelled on abandonment
  };
  std::vector<Pending> list;
  // Abandon what is still pending (after a timeout or an exception): cancel
  // receives, free the rest, so the list can be reused or destroyed.
  void abandon() {
    if (!mpi_finalized())
      for (Pending& p : list) {
        if (p.req == MPI_REQUEST_NULL) continue;
        if (p.is_recv) MPI_Cancel(&p.req);
        MPI_Request_free(&p.req);
      }
    list.clear();
  }
};

RequestList::RequestList() : impl_(new Impl) {}
RequestList::~RequestList() { impl_->abandon(); }
size_t RequestList::size() const { return impl_->list.size(); }
void RequestList::clear() {
  for (auto& p : impl_->list)
    GF_CHECK(p.req == MPI_REQUEST_NULL, "gradflow: RequestList::clear with a pending request");
  impl_->list.clear();
}

// ---------------------------------------------------------------- the communicator


MpiComm::MpiComm(uintptr_t comm_handle, double timeout_seconds)
    : impl_(new Impl), timeout_s_(timeout_seconds), blocking_(new BlockingCallState) {
  GF_CHECK(timeout_seconds > 0, "gradflow: timeout must be positive, got " << timeout_seconds);
  MPI_Comm parent = comm_handle == 0 ? MPI_COMM_WORLD : comm_from_handle<MPI_Comm>(comm_handle);
  int parent_size = 0, parent_rank = 0;
  MPI_Comm_size(parent, &parent_size);
  MPI_Comm_rank(parent, &parent_rank);
  // MPI_Comm_dup would wait for ever for a rank that exited (or is stuck)
  // before init: duplicate with MPI_Comm_idup and poll it with the deadline.
  // On a timeout the request can be neither cancelled nor freed, so it and
  // the handle MPI may still write are leaked (the job is ending).
  auto* dup = new MPI_Comm(MPI_COMM_NULL);
  auto* req = new MPI_Request(MPI_REQUEST_NULL);
  mpi_check(MPI_Comm_idup(parent, dup, req), "MPI_Comm_idup", "init");
  int rc = MPI_SUCCESS;
  bool ok = poll_until(impl_->deadline(timeout_s_), WaitStyle::kControl, [&] {
    int flag = 0;
    rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS || flag != 0;
  });
  if (rc != MPI_SUCCESS || !ok) {
    mark_broken();
    mpi_check(rc, "MPI_Test", "init (MPI_Comm_idup)");
    std::ostringstream os;
    os << "gradflow: init() on rank " << parent_rank << " timed out after " << timeout_s_
       << " s waiting for the other ranks of the " << parent_size
       << "-rank communicator to call init(); a rank may have exited or be stuck before "
          "init() (GRADFLOW_TIMEOUT sets the limit)";
    throw TransportError(os.str());
  }
  impl_->comm = *dup;
  delete dup;
  delete req;
  MPI_Comm c = impl_->comm;
  mpi_check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "MpiComm()");
  mpi_check(MPI_Comm_rank(c, &rank_), "MPI_Comm_rank", "MpiComm()");
  mpi_check(MPI_Comm_size(c, &size_), "MPI_Comm_size", "MpiComm()");
  // Local = ranks sharing memory with us; cross = ranks with our local rank.
  // These splits block, but every rank has just completed the duplicate (an
  // agreement among all ranks), so all of them are here.
  MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type", "MpiComm()");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  mpi_check(MPI_Comm_split(c, local_rank_, rank_, &cross), "MPI_Comm_split", "MpiComm()");
  MPI_Comm_rank(cross, &cross_rank_);
  MPI_Comm_size(cross, &cross_size_);
  MPI_Comm_free(&local);
  MPI_Comm_free(&cross);
  // A member outside this process's MPI_COMM_WORLD (shared_windows()). Every
  // rank of a communicator spanning several worlds sees one, but the flag is
  // agreed below anyway.
  int other_world = 0;
  {
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(c, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(size_), in_world(size_);
    for (int i = 0; i < size_; ++i) ranks[i] = i;
    mpi_check(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, in_world.data()),
              "MPI_Group_translate_ranks", "MpiComm()");
    for (int w : in_world) other_world |= w == MPI_UNDEFINED;
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  // min and max of local_size over all ranks (max as min of the negation),
  // and whether any rank saw another world (max as min of the negation).
  int sizes[3] = {local_size_, -local_size_, -other_world};
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, sizes, 3, MPI_INT, MPI_MIN, c), "MPI_Allreduce",
            "MpiComm() (node sizes)");
  homogeneous_ = sizes[0] == -sizes[1];
  one_world_ = sizes[2] == 0;
}

MpiComm::~MpiComm() { release_communicator(); }

uintptr_t create_group_communicator(uintptr_t parent_handle, const std::vector<int>& ranks,
                                    int tag) {
  MPI_Comm parent = parent_handle == 0 ? MPI_COMM_WORLD : comm_from_handle<MPI_Comm>(parent_handle);
  MPI_Group all = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
  mpi_check(MPI_Comm_group(parent, &all), "MPI_Comm_group", "add_process_set");
  mpi_check(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &sub),
            "MPI_Group_incl", "add_process_set");
  MPI_Comm out = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(parent, sub, tag, &out);
  MPI_Group_free(&sub);
  MPI_Group_free(&all);
  mpi_check(rc, "MPI_Comm_create_group", "add_process_set");
  return handle_from_comm(out);
}

void free_communicator_handle(uintptr_t handle) {
  MPI_Comm c = comm_from_handle<MPI_Comm>(handle);
  if (c != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&c);
}

void MpiComm::release_communicator() {
  // Note [Collective destruction] in mpi_comm.h.
  if (impl_->comm != MPI_COMM_NULL && !broken_ && !mpi_finalized()) MPI_Comm_free(&impl_->comm);
  impl_->comm = MPI_COMM_NULL;
}

std::string MpiComm::library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string MpiComm::built_with() {
  // Compile-time macros of mpi.h: unlike library_version() this cannot be
  // changed by which libmpi the dynamic loader happens to bind first.
#define GF_STR2(x) #x
#define GF_STR(x) GF_STR2(x)
#if defined(I_MPI_VERSION)
  return std::string("Intel MPI ") + I_MPI_VERSION;
#elif defined(MVAPICH2_VERSION)
  return std::string("MVAPICH2 ") + MVAPICH2_VERSION;
#elif defined(MPICH_VERSION)
  return std::string("MPICH ") + MPICH_VERSION;
#elif defined(OMPI_MAJOR_VERSION)
  return "Open MPI " GF_STR(OMPI_MAJOR_VERSION) "." GF_STR(OMPI_MINOR_VERSION) "."
      GF_STR(OMPI_RELEASE_VERSION);
#else
  return "unknown MPI " GF_STR(MPI_VERSION) "." GF_STR(MPI_SUBVERSION);
#endif
#undef GF_STR
#undef GF_STR2
}

// ---------------------------------------------------------------- point to point

size_t MpiComm::isend(const void* buf, size_t bytes, int dest, int tag, RequestList& reqs) {
  GF_CHECK(bytes <= size_t{INT_MAX}, "gradflow: isend of " << bytes << " bytes exceeds INT_MAX");
  MPI_Request r;
  mpi_check(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, dest, tag, impl_->comm, &r),
            "MPI_Isend", "isend");
  reqs.impl_->list.push_back({r, dest, false});
  return reqs.impl_->list.size() - 1;
}

size_t MpiComm::irecv(void* buf, size_t bytes, int src, int tag, RequestList& reqs) {
  GF_CHECK(bytes <= size_t{INT_MAX}, "gradflow: irecv of " << bytes << " bytes exceeds INT_MAX");
  MPI_Request r;
  mpi_check(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, src, tag, impl_->comm, &r),
            "MPI_Irecv", "irecv");
  reqs.impl_->list.push_back({r, src, true});
  return reqs.impl_->list.size() - 1;
}

// Waits for one request; `peer` < 0 means "all ranks" (a collective).
void MpiComm::wait_request(void* request, const char* what, int peer, WaitStyle style) {
  MPI_Request* r = static_cast<MPI_Request*>(request);
  int rc = MPI_SUCCESS;
  bool ok = poll_until(impl_->deadline(timeout_s_), style, [&] {
    int flag = 0;
    rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS || flag != 0;
  });
  if (rc != MPI_SUCCESS || !ok) mark_broken();
  mpi_check(rc, "MPI_Test", what);
  if (!ok) {
    // A pending collective cannot be cancelled; it is left to MPI (the job
    // is expected to end after this error).
    throw TransportError(timeout_message(
        timeout_s_, what, peer < 0 ? std::string("other ranks") : "rank " + std::to_string(peer)));
  }
}

void MpiComm::wait(RequestList& reqs, size_t index, const char* what) {
  auto& L = reqs.impl_->list;
  GF_CHECK(index < L.size(), "gradflow: wait on request " << index << " of " << L.size());
  if (L[index].req == MPI_REQUEST_NULL) return;
  try {
    wait_request(&L[index].req, what, L[index].peer, WaitStyle::kData);
  } catch (...) {
    reqs.impl_->abandon();
    throw;
  }
}

void MpiComm::wait_all(RequestList& reqs, const char* what, WaitStyle style) {
  auto& L = reqs.impl_->list;
  int rc = MPI_SUCCESS;
  size_t next = 0;  // requests before `next` are complete
  bool ok = poll_until(impl_->deadline(timeout_s_), style, [&] {
    for (int flag = 1; next < L.size() && flag; next += flag) {
      rc = MPI_Test(&L[next].req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return true;
    }
    return next == L.size();
  });
  if (rc != MPI_SUCCESS || !ok) {
    std::vector<int> missing;  // peers of the requests still pending
    for (size_t i = next; i < L.size(); ++i) {
      int flag = 0;
      if (L[i].req != MPI_REQUEST_NULL) MPI_Test(&L[i].req, &flag, MPI_STATUS_IGNORE);
      if (!flag) missing.push_back(L[i].peer);
    }
    reqs.impl_->abandon();
    mark_broken();
    mpi_check(rc, "MPI_Test", what);
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    throw TransportError(timeout_message(timeout_s_, what, rank_list(missing)));
  }
  L.clear();
}

namespace {
std::atomic<bool> g_threads_left_inside_mpi{false};
}  // namespace

bool threads_left_inside_mpi() { return g_threads_left_inside_mpi.load(); }

std::string MpiComm::abandon_blocking_call(bool overdue_only) {
  BlockingCallState& b = *blocking_;
  if (b.phase.load() != 1) return "";
  const char* what = b.what.load();
  const auto since = std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(b.since.load()));
  if (overdue_only && std::chrono::steady_clock::now() - since <
                          std::chrono::duration<double>(timeout_s_))
    return "";
  int inside = 1;
  if (!b.phase.compare_exchange_strong(inside, 2)) return "";  // it returned meanwhile
  g_threads_left_inside_mpi.store(true);
  mark_broken();
  // Overdue: "timed out after ..."; after interrupt_waits(): its reason.
  return timeout_message(timeout_s_, what ? what : "an MPI call", "the other ranks");
}

bool MpiComm::abandoned() const { return blocking_->phase.load() == 2; }

std::unique_ptr<RmaWindow> MpiComm::create_window(size_t bytes, bool prefer_shared) {
  // Window creation is a blocking collective; a deadline barrier first makes
  // sure every rank has arrived so a dead peer cannot hang us inside it.
  barrier("create_window");
  bool shared = prefer_shared && shared_windows();
  return make_mpi_window(*this, impl_->comm, bytes, shared);
}

}  // namespace gradflow
