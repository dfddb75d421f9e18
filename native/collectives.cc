// collectives.cc — allgather, broadcast, reducescatter and alltoall, each a
// thin layer turning rows into byte counts for MpiComm (reducescatter runs the
// ring's reduce-scatter so fp16/bf16 and every op work). No configuration.
#include "collectives.h"

#include <algorithm>
#include <cstring>

namespace gradflow {

namespace {

std::vector<size_t> row_bytes(const std::vector<int64_t>& rows, size_t row_elems, DataType dt,
                              int nranks, const char* what) {
  GF_CHECK(rows.size() == static_cast<size_t>(nranks),
           "gradflow: " << what << " needs one entry per rank, got " << rows.size() << " for "
                        << nranks << " ranks");
  std::vector<size_t> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    GF_CHECK(rows[i] >= 0, "gradflow: " << what << ": negative row count " << rows[i]
                                        << " for rank " << i);
    b[i] = static_cast<size_t>(rows[i]) * row_elems * dtype_size(dt);
  }
  return b;
}

uint64_t sum_except(const std::vector<size_t>& v, int skip) {
  uint64_t t = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (static_cast<int>(i) != skip) t += v[i];
  return t;
}

}  // namespace

void allgather(MpiComm& comm, const void* in, void* out, const std::vector<int64_t>& first_dims,
               size_t row_elems, DataType dt, TransferStats* stats) {
  auto bytes = row_bytes(first_dims, row_elems, dt, comm.size(), "allgather");
  comm.allgatherv(in, bytes[comm.rank()], out, bytes, "allgather");
  if (stats) {
    stats->bytes_sent += bytes[comm.rank()] * static_cast<uint64_t>(comm.size() - 1);
    stats->bytes_received += sum_except(bytes, comm.rank());
  }
}

void broadcast(MpiComm& comm, void* buf, size_t bytes, int root, TransferStats* stats) {
  GF_CHECK(root >= 0 && root < comm.size(),
           "gradflow: broadcast root " << root << " is not a rank of " << comm.size());
  comm.bcast(buf, bytes, root, "broadcast");
  if (stats && comm.size() > 1) {
    if (comm.rank() == root) stats->bytes_sent += bytes;
    else stats->bytes_received += bytes;
  }
}

void reducescatter(MpiComm& comm, const void* in, void* out,
                   const std::vector<int64_t>& rows_per_rank, size_t row_elems, DataType dt,
                   ReduceOp op, const RingOptions& opt, std::vector<uint8_t>& scratch,
                   TransferStats* stats) {
  auto bytes = row_bytes(rows_per_rank, row_elems, dt, comm.size(), "reducescatter");
  const size_t es = dtype_size(dt);
  std::vector<size_t> counts(bytes.size());
  size_t total = 0, mine_off = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    counts[i] = bytes[i] / es;
    if (static_cast<int>(i) < comm.rank()) mine_off += bytes[i];
    total += bytes[i];
  }
  // The ring works in place and clobbers other blocks, so it runs on a copy.
  if (scratch.size() < total) scratch.resize(total);
  if (total > 0) std::memcpy(scratch.data(), in, total);
  std::vector<uint8_t> ring_scratch;
  ring_reducescatter(comm, scratch.data(), counts, dt, op, opt, ring_scratch, stats);
  if (bytes[comm.rank()] > 0) std::memcpy(out, scratch.data() + mine_off, bytes[comm.rank()]);
}

void alltoall(MpiComm& comm, const void* in, void* out, const std::vector<int64_t>& splits,
              size_t row_elems, DataType dt, TransferStats* stats) {
  const int n = comm.size(), me = comm.rank();
  GF_CHECK(splits.size() == static_cast<size_t>(n) * n,
           "gradflow: alltoall needs a " << n << "x" << n << " splits matrix, got "
                                         << splits.size() << " entries");
  std::vector<int64_t> send(splits.begin() + me * n, splits.begin() + (me + 1) * n), recv(n);
  for (int p = 0; p < n; ++p) recv[p] = splits[p * n + me];
  auto sb = row_bytes(send, row_elems, dt, n, "alltoall send_splits");
  auto rb = row_bytes(recv, row_elems, dt, n, "alltoall recv_splits");
  // The largest send or receive total of any rank, from the agreed matrix.
  size_t largest = 0;
  for (int p = 0; p < n; ++p) {
    size_t sent = 0, received = 0;
    for (int q = 0; q < n; ++q) {
      sent += static_cast<size_t>(splits[p * n + q]) * row_elems * dtype_size(dt);
      received += static_cast<size_t>(splits[q * n + p]) * row_elems * dtype_size(dt);
    }
    largest = std::max({largest, sent, received});
  }
  comm.alltoallv(in, sb, out, rb, largest, "alltoall");
  if (stats) {
    stats->bytes_sent += sum_except(sb, me);
    stats->bytes_received += sum_except(rb, me);
  }
}

}  // namespace gradflow
