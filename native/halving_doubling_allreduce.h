// halving_doubling_allreduce.h — Rabenseifner's allreduce: a reduce-scatter
// by recursive halving, then an allgather by recursive doubling. The ring's
// bytes (2(N-1)/N of the buffer per rank, for a power of two) in 2·log2 N
// exchanges instead of 2(N-1). Uses only MpiComm point-to-point, the wire
// codec and the reduce kernels; never reads configuration or the runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"  // TransferStats

namespace gradflow {

// In-place allreduce with the ring's contract: kAverage reduces as a sum
// (the caller scales); every rank ends with bitwise-identical bytes. `wire`
// is honoured for float32 sum/average as in the ring (16-bit on the wire,
// fp32 sums, the result rounded once to what the wire can carry). Each
// exchange moves in pieces of at most `piece_bytes` so that the reduction of
// one piece overlaps the arrival of the next. `scratch` is caller-owned
// memory the function may grow.
void halving_doubling_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                                WireDtype wire, size_t piece_bytes, std::vector<uint8_t>& scratch,
                                TransferStats* stats);

}  // namespace gradflow
