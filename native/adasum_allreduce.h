// adasum_allreduce.h — Adasum, the scale-invariant "adaptive summation" of
// gradients (Maleki et al., as in Horovod's op=Adasum), by vector-halving
// distance-doubling (VHDD) over MpiComm point-to-point. Owns its receive
// scratch; never reads configuration or the runtime.
//
// Pairwise rule, per tensor (a, b the two operands' values of one tensor):
//   adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// where a coefficient whose squared norm is below sqrt(DBL_MIN) stays 1
// (a zero operand leaves the other unchanged: adasum(a, 0) = a).
//
// Tree: at 2^k ranks the ranks are combined pairwise by distance doubling:
// level 1 combines (0,1), (2,3), ...; level 2 combines {0,1} with {2,3}, ...
// — the left operand is always the group with the lower ranks. So at 4 ranks
// the result is adasum(adasum(x0, x1), adasum(x2, x3)). Only power-of-two
// rank counts are supported (as in Horovod); Runtime::submit refuses others.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"  // TransferStats

namespace gradflow {

// Whether an allreduce with op=Adasum of `dt` can run on `comm_size` ranks;
// `why` explains a refusal (fp16/bf16/fp32/fp64 only; power-of-two sizes).
bool adasum_supported(DataType dt, int comm_size, std::string* why);

class AdasumAllreduce {
 public:
  explicit AdasumAllreduce(MpiComm& comm) : comm_(comm) {}

  // In place: `buf` holds counts.size() tensors back to back (a fusion
  // buffer or one tensor); each tensor gets its own dot products and norms,
  // so fusing never changes the result. Every rank ends bitwise identical.
  // fp16/bf16 data is widened to fp32 for the whole reduction (and travels
  // as fp32), then rounded once at the end; dot products and norms are
  // accumulated in double for every dtype.
  void allreduce(void* buf, const std::vector<size_t>& counts, DataType dt, TransferStats* ts);

 private:
  template <typename T>
  void run(T* buf, const std::vector<size_t>& counts, TransferStats* ts);
  // Sums `v` (3 doubles per tensor) over the aligned block of `group`
  // ranks containing this rank, in a fixed tree so every member gets the
  // same bits (MPI_Allreduce promises no such thing).
  void group_sum(std::vector<double>& v, int group, TransferStats* ts);
  void exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int peer,
                TransferStats* ts);

  MpiComm& comm_;
  std::vector<uint8_t> recv_;    // the partner's half at each halving level
  std::vector<float> widened_;   // fp16/bf16 input as fp32
  std::vector<double> peer_sums_;
};

}  // namespace gradflow
