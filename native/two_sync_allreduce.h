// two_sync_allreduce.h — the MiMatrix two-synchronization allreduce (GDRAA):
// every rank exposes its buffer in an RMA window; after sync 1 rank r reads
// segment r from all peers and reduces it; after sync 2 every rank reads the
// other reduced segments from their owners. Uses MpiComm windows only.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"  // TransferStats

namespace gradflow {

// Holds the (double-buffered) RMA windows between calls so each allreduce
// costs exactly two synchronizations. One instance per communicator; must be
// used by one thread (the background loop) and destroyed before MPI ends, by
// every rank together (its destructor is collective, with a deadline).
class TwoSyncAllreduce {
 public:
  // `prefer_shared` = false forces the MPI_Get path even on one node (tests,
  // benchmarks); with true, shared memory is used when all ranks share a node.
  explicit TwoSyncAllreduce(MpiComm& comm, bool prefer_shared = true);
  ~TwoSyncAllreduce();

  // In-place allreduce with the same contract as ring_allreduce (kAverage
  // reduces as a sum; bitwise-identical result on all ranks). `wire` is
  // honoured for float32 sum/average as in the ring: 16-bit shards, fp32 sum
  // by the segment owner, one rounding.
  void allreduce(void* buf, size_t count, DataType dt, ReduceOp op, WireDtype wire,
                 TransferStats* stats);

  bool uses_shared_memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradflow
