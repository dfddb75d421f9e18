// recursive_doubling_allreduce.h — the latency-optimal allreduce for small
// messages: ceil(log2 N) exchanges of the whole buffer (plus two for a rank
// count that is not a power of two) instead of the ring's 2(N-1) hops. Uses
// only MpiComm point-to-point, the wire codec and the reduce kernels; never
// reads configuration or the runtime.
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
// fp32 sums, the result rounded once to what the wire can carry).
// `scratch` is caller-owned memory the function may grow.
void recursive_doubling_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                                  WireDtype wire, std::vector<uint8_t>& scratch,
                                  TransferStats* stats);

}  // namespace gradflow
