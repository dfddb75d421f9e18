// mpi_allreduce.h — the "mpi" allreduce algorithm: the MPI library's own
// collectives. MPI_Allreduce where MPI has the type and op; a reduce-scatter
// built from MPI_Alltoallv plus MPI_Allgatherv for the 16-bit wire and for
// fp16/bf16 data (MPI has no 16-bit float type). Never reads configuration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"  // TransferStats

namespace gradflow {

// In-place allreduce with the ring's contract (kAverage reduces as a sum;
// bitwise-identical result on every rank). `wire` is honoured for float32
// sum/average exactly as in the two-sync allreduce: each rank sends 16-bit
// shards to the segment owners, the owner sums them in fp32 in rank order and
// rounds once; the owners' 16-bit results are gathered by everyone.
// `scratch` is caller-owned memory the function may grow.
void mpi_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                   WireDtype wire, std::vector<uint8_t>& scratch, TransferStats* stats);

// True if mpi_allreduce uses MPI_Allreduce itself for these arguments (else
// the alltoall + owner reduce + allgather exchange).
bool mpi_allreduce_is_builtin(DataType dt, ReduceOp op, WireDtype wire);

}  // namespace gradflow
