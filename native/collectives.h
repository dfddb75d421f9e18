// collectives.h — allgather, broadcast, reducescatter and alltoall on top of
// MpiComm (reducescatter reuses the ring's reduce-scatter so every dtype,
// fp16/bf16 included, is supported). No configuration, no runtime access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"

namespace gradflow {

// Rank r contributes `first_dims[r]` rows of `row_elems` elements each;
// `out` receives all rows in rank order (sized by the caller).
void allgather(MpiComm& comm, const void* in, void* out, const std::vector<int64_t>& first_dims,
               size_t row_elems, DataType dt, TransferStats* stats);

// In place: root's buffer is copied to every rank.
void broadcast(MpiComm& comm, void* buf, size_t bytes, int root, TransferStats* stats);

// `in` has sum(rows_per_rank) rows; `out` receives rows_per_rank[rank] rows,
// reduced across ranks. kAverage reduces as a sum (the caller scales).
void reducescatter(MpiComm& comm, const void* in, void* out,
                   const std::vector<int64_t>& rows_per_rank, size_t row_elems, DataType dt,
                   ReduceOp op, const RingOptions& opt, std::vector<uint8_t>& scratch,
                   TransferStats* stats);

// `splits` is the agreed size*size matrix: splits[p * size + q] rows go
// from rank p to rank q. This rank sends row `rank` and receives column
// `rank`; the whole matrix (the same on every rank) picks the protocol, so
// every rank posts the same one (see MpiComm::alltoallv).
void alltoall(MpiComm& comm, const void* in, void* out, const std::vector<int64_t>& splits,
              size_t row_elems, DataType dt, TransferStats* stats);

}  // namespace gradflow
