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

// Per-buffer error-feedback state. Usage each step (see sparse_allreduce in
// the loop):
//   1. accumulate(grad): residual += grad   (with momentum correction:
//      velocity = m * velocity + grad; residual += velocity)
//   2. importance(); allreduce the vector (sum); select_top_chunks
//   3. pack residual's chosen chunks; allreduce; unpack into grad, zero the
//      other chunks of grad
//   4. clear_sent(chunks): residual (and velocity) of the sent chunks := 0
class SparseResidual {
 public:
  SparseResidual(size_t count, size_t chunk_elems, float momentum);
  void accumulate(const float* grad);
  void importance(std::vector<float>* out) const;
  // Steps 1-2 in one pass: accumulate(grad), importance(out), and zero
  // `grad` (the caller unpacks the reduced chosen chunks into it; every
  // other chunk of the result is zero). Same numbers as the two calls.
  void absorb(float* grad, std::vector<float>* importance);
  const float* residual() const { return residual_.data(); }
  void clear_sent(const std::vector<uint32_t>& chunks);
  size_t count() const { return residual_.size(); }
  size_t chunk_elems() const { return chunk_elems_; }

 private:
  void accumulate_range(const float* grad, size_t begin, size_t end);
  std::vector<float> residual_;
  std::vector<float> velocity_;  // empty unless momentum correction is on
  size_t chunk_elems_;
  float momentum_;
};

}  // namespace gradflow
