// mpi_data_collectives.cc — MpiComm's data collectives (byte granularity):
// broadcast, ragged allgather and alltoall, each MPI's own nonblocking
// collective while counts fit an int and a chunked point-to-point exchange
// past that. Used by collectives.cc and the mpi allreduce; no tensors here.
#include <algorithm>
#include <cstring>
#include <vector>

#include "mpi_internal.h"

namespace gradflow {

void MpiComm::bcast(void* buf, size_t bytes, int root, const char* what) {
  // Chunks of <= kMaxCount bytes: MPI counts are int.
  for (size_t done = 0; done < bytes; done += kMaxCount) {
    int c = static_cast<int>(std::min(kMaxCount, bytes - done));
    MPI_Request r;
    mpi_check(MPI_Ibcast(static_cast<char*>(buf) + done, c, MPI_BYTE, root, impl_->comm, &r),
              "MPI_Ibcast", what);
    wait_request(&r, what, root, WaitStyle::kData);
  }
}

namespace {

// Byte offsets of consecutive blocks; `ints` is false if any exceeds an int.
std::vector<size_t> offsets_of(const std::vector<size_t>& sizes, bool* ints) {
  std::vector<size_t> off(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) off[i + 1] = off[i] + sizes[i];
  *ints = *ints && off.back() <= kMaxCount;
  return off;
}
std::vector<int> as_int(const std::vector<size_t>& v, size_t n) {
  return std::vector<int>(v.begin(), v.begin() + n);
}

// The fallback for totals past an int: every pair exchanges its block
// point-to-point in chunks of kMaxCount bytes (any MPI version, any size).
// `send_off[p]`/`recv_off[p]` locate the block for/from rank p.
void exchange_p2p(MpiComm& c, const char* send, const std::vector<size_t>& send_off,
                  const std::vector<size_t>& send_bytes, char* recv,
                  const std::vector<size_t>& recv_off, const std::vector<size_t>& recv_bytes,
                  const char* what) {
  const int n = c.size(), r = c.rank();
  std::memcpy(recv + recv_off[r], send + send_off[r], recv_bytes[r]);
  RequestList reqs;
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n, from = (r - k + n) % n;
    for (size_t d = 0; d < recv_bytes[from]; d += kMaxCount)
      c.irecv(recv + recv_off[from] + d, std::min(kMaxCount, recv_bytes[from] - d), from,
              kTagCollective, reqs);
    for (size_t d = 0; d < send_bytes[to]; d += kMaxCount)
      c.isend(send + send_off[to] + d, std::min(kMaxCount, send_bytes[to] - d), to,
              kTagCollective, reqs);
  }
  c.wait_all(reqs, what);
}

}  // namespace

// Both v-collectives use MPI's own algorithm while every rank's counts and
// displacements fit an int, and exchange_p2p past that; the choice must be
// the same on every rank (allgatherv: the agreed recv sizes; alltoallv: the
// caller's agreed largest total).
void MpiComm::allgatherv(const void* send, size_t send_bytes, void* recv,
                         const std::vector<size_t>& recv_bytes, const char* what) {
  GF_CHECK(recv_bytes.size() == static_cast<size_t>(size_) && recv_bytes[rank_] == send_bytes,
           "gradflow: allgatherv sizes disagree with the local send size in " << what);
  bool ints = true;
  auto roff = offsets_of(recv_bytes, &ints);
  if (ints) {
    auto counts = as_int(recv_bytes, size_), displs = as_int(roff, size_);
    MPI_Request r;
    mpi_check(MPI_Iallgatherv(send, static_cast<int>(send_bytes), MPI_BYTE, recv, counts.data(),
                              displs.data(), MPI_BYTE, impl_->comm, &r),
              "MPI_Iallgatherv", what);
    wait_request(&r, what, -1, WaitStyle::kData);
    return;
  }
  // Everyone gets the same block: all send offsets are 0.
  exchange_p2p(*this, static_cast<const char*>(send), std::vector<size_t>(size_, 0),
               std::vector<size_t>(size_, send_bytes), static_cast<char*>(recv), roff, recv_bytes,
               what);
}

void MpiComm::alltoallv(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                        const std::vector<size_t>& recv_bytes, size_t largest_total,
                        const char* what) {
  GF_CHECK(send_bytes.size() == static_cast<size_t>(size_) &&
               recv_bytes.size() == static_cast<size_t>(size_) &&
               send_bytes[rank_] == recv_bytes[rank_],
           "gradflow: alltoallv needs one size per rank and equal self blocks in " << what);
  bool ints = true;
  auto soff = offsets_of(send_bytes, &ints), roff = offsets_of(recv_bytes, &ints);
  // Decided from the agreed total, not this rank's own (which differ between
  // ranks): every rank must post the same protocol.
  GF_CHECK(soff.back() <= largest_total && roff.back() <= largest_total,
           "gradflow: alltoallv: this rank's totals exceed the agreed largest in " << what);
  ints = largest_total <= kMaxCount;
  if (ints) {
    auto sc = as_int(send_bytes, size_), sd = as_int(soff, size_);
    auto rcn = as_int(recv_bytes, size_), rd = as_int(roff, size_);
    MPI_Request r;
    mpi_check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rcn.data(), rd.data(),
                             MPI_BYTE, impl_->comm, &r),
              "MPI_Ialltoallv", what);
    wait_request(&r, what, -1, WaitStyle::kData);
    return;
  }
  exchange_p2p(*this, static_cast<const char*>(send), soff, send_bytes, static_cast<char*>(recv),
               roff, recv_bytes, what);
}

}  // namespace gradflow
