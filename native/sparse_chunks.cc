// sparse_chunks.cc — coarse-grained sparse communication (CSC): chunk
// importance, global top-k selection, pack/unpack and the error-feedback
// residual with optional momentum correction. Pure computation: no MPI, no
// configuration, no threads; the background loop does the allreduces.
//
// Note [Coarse-grained sparse communication]
// ------------------------------------------
// Glossary. A *buffer* is one flat float32 gradient range (usually a whole
// gradient pool) of `count` elements. It is cut into *chunks* of
// `chunk_elems` consecutive elements; chunk c covers [c*chunk_elems,
// min((c+1)*chunk_elems, count)), so only the last chunk may be short. The
// *residual* is what a rank has not sent yet; the *importance* of a chunk is
// the L1 norm of its residual (residual + this step's gradient).
//
// One step, on every rank:
//   1. absorb: the would-be residual — residual + grad, or with momentum
//      correction residual + velocity where velocity = m*velocity + grad
//      (Deep Gradient Compression, Lin et al. 2018, so momentum is not lost
//      on chunks that wait several steps) — is written to a spare buffer,
//      with one float per chunk (its L1 norm, the importance) and the
//      gradient zeroed, in one pass. The residual itself is not written.
//      The caller allreduces the importance vector with a sum, so every rank
//      holds the same one.
//   2. overflow: a non-finite entry means some rank's gradient has an inf or
//      NaN (an AMP loss-scale overflow, or a diverged model). Every rank sees
//      it, sends nothing, writes non-finite values into those chunks of the
//      output (mark_overflow) and keeps its residual: the step is skipped
//      (GradScaler) and the residual is as if it never happened. Absorbing
//      it instead would park inf in unsent chunks that then reach the
//      optimizer one step at a time, each skipping a step.
//   3. select: the k chunks with the largest global importance.
//   4. commit: the spare becomes the residual (a pointer swap, no copy); the
//      chosen chunks are packed contiguously and leave it (and the velocity:
//      momentum factor masking). The caller allreduces the packed buffer
//      densely (so ring/two-sync and the fp16 wire still apply) and unpacks
//      it. Nothing is ever dropped, only delayed (error feedback): sum of
//      sent + final residual == sum of gradients. Units: the residual holds
//      what the caller passed (the executor applies the prescale first); the
//      torch binding divides by the AMP loss scale there, so the residual
//      stays valid when the scale moves.
//
// Why ties are broken by index: the dense allreduce in step 4 only works if
// every rank packs the *same* chunks in the *same* order; a rank that picked a
// different chunk would add unrelated numbers (or hang on a different size).
// All ranks hold a bitwise identical importance vector after step 2, so a
// deterministic total order on (importance desc, index asc) gives every rank
// the same set, whatever the std::nth_element implementation does with equal
// keys. NaN importances (a NaN gradient) rank above everything, so a NaN is
// sent and surfaces at once instead of hiding in the residual.
//
// Cost: absorb is one pass (read residual and gradient, write the spare and
// the zeroed gradient: the same bytes as updating the residual in place,
// plus write-allocation of the spare); the spare doubles the residual's
// memory, the price of keeping the residual intact until every rank knows
// whether the step overflowed. Selection is O(C + k log k) for C chunks
// (nth_element, then sorting only the k winners by index); pack/unpack are
// one memcpy per chosen chunk.
#include "sparse_chunks.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common.h"

namespace gradflow {

namespace {

std::atomic<int64_t> g_live_elements{0};

// [begin, end) element range of chunk c; checks c is in range.
void chunk_range(uint32_t c, size_t count, size_t chunk_elems, size_t* begin, size_t* end) {
  size_t n = num_chunks(count, chunk_elems);
  GF_CHECK(c < n, "sparse chunk index " << c << " out of range: the buffer of " << count
                                        << " elements has " << n << " chunks of "
                                        << chunk_elems);
  *begin = static_cast<size_t>(c) * chunk_elems;
  *end = std::min(*begin + chunk_elems, count);
}

// Strict total order "a is more important than b": NaN first, then larger
// value, then lower index. Every rank evaluates it on identical inputs.
struct MoreImportant {
  const std::vector<float>* imp;
  bool operator()(uint32_t a, uint32_t b) const {
    float x = (*imp)[a], y = (*imp)[b];
    bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return xn;
    if (!xn && x != y) return x > y;
    return a < b;
  }
};

}  // namespace

// sum |x[i]|. Eight float lanes over blocks of 256 elements (vectorizable,
// no serial dependency chain), blocks combined in double: a chunk of 32768
// floats summed serially in float would lose ~3 digits, and serially in
// double is latency-bound (one add per ~4 cycles — it was most of CSC's host
// time on an 84 MB buffer).
double l1_norm(const float* x, size_t n) {
  constexpr size_t kLanes = 8, kBlock = 256;
  double sum = 0.0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(b + kBlock, n);
    float lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] += std::fabs(x[i + j]);
    for (size_t j = 0; i < e; ++i, ++j) lane[j] += std::fabs(x[i]);  // tail < kLanes
    for (size_t j = 0; j < kLanes; ++j) sum += lane[j];
  }
  return sum;
}

size_t num_chunks(size_t count, size_t chunk_elems) {
  GF_CHECK(chunk_elems > 0, "sparse chunk size must be > 0 elements (GRADFLOW_SPARSE_CHUNK)");
  return count / chunk_elems + (count % chunk_elems != 0 ? 1 : 0);
}

void chunk_importance(const float* values, size_t count, size_t chunk_elems,
                      std::vector<float>* importance) {
  size_t n = num_chunks(count, chunk_elems);
  importance->assign(n, 0.0f);
  for (size_t c = 0; c < n; ++c) {
    size_t begin = c * chunk_elems;
    size_t end = std::min(begin + chunk_elems, count);
    (*importance)[c] = static_cast<float>(l1_norm(values + begin, end - begin));
  }
}

std::vector<uint32_t> select_top_chunks(const std::vector<float>& importance, size_t k) {
  const size_t n = importance.size();
  GF_CHECK(n <= static_cast<size_t>(UINT32_MAX),
           "too many sparse chunks (" << n << "); raise GRADFLOW_SPARSE_CHUNK");
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (k >= n) return order;  // everything, already ascending
  if (k == 0) return {};
  MoreImportant more{&importance};
  // Afterwards order[0..k) are the k most important chunks (in any order).
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                   more);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

size_t packed_size(const std::vector<uint32_t>& chunks, size_t count, size_t chunk_elems) {
  size_t total = 0;
  for (uint32_t c : chunks) {
    size_t begin, end;
    chunk_range(c, count, chunk_elems, &begin, &end);
    total += end - begin;
  }
  return total;
}

void pack_chunks(const float* src, size_t count, size_t chunk_elems,
                 const std::vector<uint32_t>& chunks, float* packed) {
  size_t out = 0;
  for (uint32_t c : chunks) {
    size_t begin, end;
    chunk_range(c, count, chunk_elems, &begin, &end);
    std::memcpy(packed + out, src + begin, (end - begin) * sizeof(float));
    out += end - begin;
  }
}

void unpack_chunks(const float* packed, size_t count, size_t chunk_elems,
                   const std::vector<uint32_t>& chunks, float* dst) {
  size_t in = 0;
  for (uint32_t c : chunks) {
    size_t begin, end;
    chunk_range(c, count, chunk_elems, &begin, &end);
    std::memcpy(dst + begin, packed + in, (end - begin) * sizeof(float));
    in += end - begin;
  }
}

SparseResidual::SparseResidual(size_t count, size_t chunk_elems, float momentum)
    : residual_(count, 0.0f), chunk_elems_(chunk_elems), momentum_(momentum) {
  GF_CHECK(chunk_elems > 0, "sparse chunk size must be > 0 elements (GRADFLOW_SPARSE_CHUNK)");
  GF_CHECK(momentum >= 0.0f && momentum < 1.0f,
           "sparse momentum must be in [0, 1), got " << momentum
                                                     << " (GRADFLOW_SPARSE_MOMENTUM)");
  if (momentum_ > 0.0f) velocity_.assign(count, 0.0f);
  g_live_elements += static_cast<int64_t>(count);
}

SparseResidual::~SparseResidual() { g_live_elements -= static_cast<int64_t>(residual_.size()); }

int64_t SparseResidual::live_elements() { return g_live_elements.load(); }

void SparseResidual::accumulate(const float* grad) { accumulate_range(grad, 0, residual_.size()); }

void SparseResidual::accumulate_range(const float* grad, size_t begin, size_t end) {
  float* res = residual_.data();
  if (velocity_.empty()) {
    for (size_t i = begin; i < end; ++i) res[i] += grad[i];
    return;
  }
  // Momentum correction: accumulate the velocity, not the raw gradient.
  float* vel = velocity_.data();
  for (size_t i = begin; i < end; ++i) {
    vel[i] = momentum_ * vel[i] + grad[i];
    res[i] += vel[i];
  }
}

void SparseResidual::absorb(float* grad, std::vector<float>* importance) {
  const size_t count = residual_.size();
  const size_t n = num_chunks(count, chunk_elems_);
  importance->assign(n, 0.0f);
  // First use allocates the spares (then they are reused every step).
  if (next_residual_.size() != count) next_residual_.assign(count, 0.0f);
  if (velocity_.size() != next_velocity_.size()) next_velocity_.assign(velocity_.size(), 0.0f);
  const float* res = residual_.data();
  const float* vel = velocity_.data();
  float* nres = next_residual_.data();
  float* nvel = next_velocity_.data();
  const float m = momentum_;
  // Chunk by chunk, so the chunk is still in cache for the norm and the
  // zeroing: one trip through memory. Same expressions as accumulate_range.
  for (size_t c = 0; c < n; ++c) {
    const size_t begin = c * chunk_elems_, end = std::min(begin + chunk_elems_, count);
    if (velocity_.empty()) {
      for (size_t i = begin; i < end; ++i) nres[i] = res[i] + grad[i];
    } else {
      for (size_t i = begin; i < end; ++i) {
        nvel[i] = m * vel[i] + grad[i];
        nres[i] = res[i] + nvel[i];
      }
    }
    (*importance)[c] = static_cast<float>(l1_norm(nres + begin, end - begin));
    std::memset(grad + begin, 0, (end - begin) * sizeof(float));
  }
  absorbed_ = true;
  committed_ = false;  // next_* now hold this step's would-be residual
}

void SparseResidual::commit(const std::vector<uint32_t>& chunks, float* packed) {
  GF_CHECK(absorbed_, "SparseResidual::commit without absorb");
  absorbed_ = false;
  committed_ = true;
  residual_.swap(next_residual_);
  velocity_.swap(next_velocity_);
  size_t out = 0;
  for (size_t j = 0; j < chunks.size(); ++j) {
    GF_CHECK(j == 0 || chunks[j - 1] < chunks[j], "sparse chunks must be ascending and distinct");
    size_t begin, end;
    chunk_range(chunks[j], residual_.size(), chunk_elems_, &begin, &end);
    std::memcpy(packed + out, residual_.data() + begin, (end - begin) * sizeof(float));
    out += end - begin;
  }
  clear_sent(chunks);
}

void SparseResidual::rollback() {
  if (!committed_) return;
  // commit swapped the untouched old residual (and velocity) into next_*.
  residual_.swap(next_residual_);
  velocity_.swap(next_velocity_);
  committed_ = false;
}

void SparseResidual::importance(std::vector<float>* out) const {
  chunk_importance(residual_.data(), residual_.size(), chunk_elems_, out);
}

void SparseResidual::clear_sent(const std::vector<uint32_t>& chunks) {
  for (uint32_t c : chunks) {
    size_t begin, end;
    chunk_range(c, residual_.size(), chunk_elems_, &begin, &end);
    std::fill(residual_.begin() + begin, residual_.begin() + end, 0.0f);
    // Momentum factor masking (DGC): sent chunks restart their velocity.
    if (!velocity_.empty()) std::fill(velocity_.begin() + begin, velocity_.begin() + end, 0.0f);
  }
}

bool any_non_finite(const std::vector<float>& importance) {
  for (float x : importance)
    if (!std::isfinite(x)) return true;
  return false;
}

void mark_overflow(const std::vector<float>& importance, size_t count, size_t chunk_elems,
                   float* out) {
  std::memset(out, 0, count * sizeof(float));
  for (size_t c = 0; c < importance.size(); ++c) {
    if (std::isfinite(importance[c])) continue;
    size_t begin, end;
    chunk_range(static_cast<uint32_t>(c), count, chunk_elems, &begin, &end);
    std::fill(out + begin, out + end, importance[c]);
  }
}

}  // namespace gradflow
