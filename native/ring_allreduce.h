// ring_allreduce.h — bandwidth-optimal ring allreduce and the ring
// reduce-scatter it is made of. Uses only MpiComm point-to-point, the wire
// codec and the reduce kernels; never reads configuration or the runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "transfer_stats.h"

namespace gradflow {

struct RingOptions {
  // Each segment moves in pieces of at most this many bytes so the reduce
  // of piece j overlaps the transfer of piece j+1 (pipelining).
  size_t pipeline_bytes = 1 << 20;
  // Only honoured for float32 with kSum/kAverage; otherwise native.
  WireDtype wire = WireDtype::kNative;
  // ring_allreduce only: when set, the input is read from here and `buf` is
  // only written (Note [Out-of-place ring], ring_allreduce.cc), so the caller
  // need not copy the input into `buf` first. Must not overlap `buf`.
  const void* input = nullptr;
};

// Allreduce of `count` elements of `buf`, in place (or of opt.input into `buf`). `op` kAverage reduces as a
// sum (the caller scales). All ranks end with bitwise-identical buffers.
// `scratch` is caller-owned memory the function may grow.
void ring_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                    const RingOptions& opt, std::vector<uint8_t>& scratch, TransferStats* stats);

// Reduce-scatter: `buf` holds the full input on every rank; on return the
// block [offsets[r], offsets[r] + counts[r]) of `buf` on rank r holds the
// reduction of that block across ranks (other blocks are clobbered).
// `counts` has one entry per rank and sums to the buffer length.
void ring_reducescatter(MpiComm& comm, void* buf, const std::vector<size_t>& counts, DataType dt,
                        ReduceOp op, const RingOptions& opt, std::vector<uint8_t>& scratch,
                        TransferStats* stats);

}  // namespace gradflow
