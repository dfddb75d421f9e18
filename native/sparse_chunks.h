// sparse_chunks.h — coarse-grained sparse communication (CSC). The buffer is
// cut into fixed-size chunks; chunk importance is the L1 norm of
// (residual + gradient); the same global top-k chunks are chosen on every
// rank from an allreduced importance vector; chosen chunks are packed,
// reduced densely by the caller, unpacked; the rest stays in the residual.
// Pure functions and a small state class: no MPI, no configuration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradflow {

// Number of chunks covering `count` elements (last chunk may be short).
size_t num_chunks(size_t count, size_t chunk_elems);

// sum_i |x[i]|: eight float lanes over blocks of 256, blocks combined in double.
double l1_norm(const float* x, size_t n);

// importance[c] = sum_{i in chunk c} |values[i]| (as float, accumulated in double).
void chunk_importance(const float* values, size_t count, size_t chunk_elems,
                      std::vector<float>* importance);

// Indices of the k most important chunks, sorted ascending. Ties are broken
// by lower index first so every rank given the same vector picks the same set.
std::vector<uint32_t> select_top_chunks(const std::vector<float>& importance, size_t k);

// Number of elements covered by `chunks` (accounts for the short last chunk).
size_t packed_size(const std::vector<uint32_t>& chunks, size_t count, size_t chunk_elems);

// Copy the chosen chunks of `src` into contiguous `packed` and back.
void pack_chunks(const float* src, size_t count, size_t chunk_elems,
                 const std::vector<uint32_t>& chunks, float* packed);
void unpack_chunks(const float* packed, size_t count, size_t chunk_elems,
                   const std::vector<uint32_t>& chunks, float* dst);

// Per-buffer error-feedback state: one float per gradient element (the
// residual), plus the velocity with momentum correction, each with a spare
// of the same size that the next value is written to. Usage each step
// (allreduce_sparse in response_executor.cc):
//   1. absorb(grad, &importance): writes the would-be residual (residual +
//      grad, or residual + (m * velocity + grad) with momentum correction)
//      into the spare, its L1 norm per chunk into `importance`, and zeroes
//      `grad`. The residual itself is not touched.
//   2. allreduce the importance vector (sum). A non-finite entry means some
//      rank's gradient overflowed: skip 3, call mark_overflow() instead; the
//      residual stays exactly as it was (GradScaler skips the step; nothing
//      this step sent or absorbed is lost or kept).
//   3. select_top_chunks; commit(chunks, packed): the spare becomes the
//      residual (a swap), the chosen chunks go to `packed` and leave it (and
//      the velocity). The caller reduces `packed` and unpacks it into grad.
// accumulate / importance / clear_sent are the same step in separate calls,
// in place (the simple reference the tests compare absorb + commit with).
class SparseResidual {
 public:
  SparseResidual(size_t count, size_t chunk_elems, float momentum);
  ~SparseResidual();
  SparseResidual(const SparseResidual&) = delete;
  SparseResidual& operator=(const SparseResidual&) = delete;
  // Elements held by all live residuals in the process (tests check that
  // residuals are freed and that there is one per gradient element).
  static int64_t live_elements();

  void absorb(float* grad, std::vector<float>* importance);
  void commit(const std::vector<uint32_t>& chunks, float* packed);
  // Undoes the last commit (a no-op unless commit ran since the last
  // absorb): the residual and velocity are again what they were before that
  // step. For a step whose reduced gradient the optimizer never applied (a
  // GradScaler skip caused by another bucket's overflow): the chunks it sent
  // stay owed instead of being lost.
  void rollback();
  void accumulate(const float* grad);
  void importance(std::vector<float>* out) const;
  void clear_sent(const std::vector<uint32_t>& chunks);
  const float* residual() const { return residual_.data(); }
  size_t count() const { return residual_.size(); }
  size_t chunk_elems() const { return chunk_elems_; }

 private:
  void accumulate_range(const float* grad, size_t begin, size_t end);
  std::vector<float> residual_;
  std::vector<float> velocity_;  // empty unless momentum correction is on
  std::vector<float> next_residual_, next_velocity_;  // absorb's output, swapped in by commit
  bool absorbed_ = false;  // absorb ran and commit has not
  bool committed_ = false;  // commit ran and absorb has not: next_* hold the step's start
  size_t chunk_elems_;
  float momentum_;
};

// True if any entry is NaN or infinite (an overflowed gradient somewhere).
bool any_non_finite(const std::vector<float>& importance);

// Overflow step output: each chunk whose (global) importance is not finite
// is filled with that value, every other element is 0. Same on every rank,
// so GradScaler sees the overflow everywhere and skips the step everywhere.
void mark_overflow(const std::vector<float>& importance, size_t count, size_t chunk_elems,
                   float* out);

}  // namespace gradflow
