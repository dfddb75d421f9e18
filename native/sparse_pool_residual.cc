// sparse_pool_residual.cc — CSC with the residual in the gradient pool:
// sampled chunk importance, take (pack + zero) the chosen chunks out of the
// pool, re-zero only what was written into the output last step.
//
// Note [Residual in the pool]
// ---------------------------
// The classic CSC step (SparseResidual, sparse_chunks.cc) reads and writes
// the whole buffer several times per step (residual + gradient into a spare,
// L1 norms, gradient zeroed), and the optimizer's zero_grad() zeroes the
// whole pool again: ~49 ms per step and rank for 25.2 M parameters, against
// a budget of ~5 ms, less than one read of the 100 MB buffer on this
// machine. So the residual moves into the pool (torch binding,
// gradflow/torch/optimizer_residual.py):
//   * the pool P is never zeroed; autograd adds each new gradient into
//     P = residual in place (the add it does anyway), so after backward P is
//     residual + this step's gradients, for free;
//   * importance is estimated from a 1/8 sample of each chunk
//     (sampled_chunk_importance): selection only decides *which* chunks go
//     now, nothing is lost whichever are chosen, and every rank samples the
//     same positions, so the allreduced estimates still make every rank
//     choose the same chunks (Deep Gradient Compression samples for its
//     top-k threshold the same way). The sample rotates with the bucket's
//     sparse step count: with one fixed sample, a chunk whose sampled part
//     stays near zero (a rarely used embedding row, a frozen slice) would
//     never be chosen while its residual grew elsewhere in the chunk;
//     rotated, every element is looked at once every 8 steps;
//   * the chosen chunks are copied out of P and zeroed there (take_chunks):
//     sent + P == sum of gradients, exactly (the same float adds as the
//     classic path for one backward per step);
//   * the reduced chunks are unpacked into a second buffer G, the
//     optimizer's param.grad during step(); only the chunks written into G
//     last step are re-zeroed (clear_output), unless the binding reports
//     that something else wrote into G (mark_output_dirty: its version
//     counter moved — clip_grad_norm_, unscale_, an in-place weight decay),
//     then all of G is zeroed once.
// Overflow: if the (sampled) global importance has an inf/NaN, nothing is
// sent and G gets the non-finite marks, as in the classic path (the same
// collectives in the same order, so a joined rank on the classic path stays
// in step). The residual cannot be restored (the overflowed gradient is
// already inside P), so those chunks are dropped from P instead of being
// kept for ever; the exact "residual as it was" needs the classic path,
// which the binding keeps for grad_scaler=, sparse momentum and the copy
// path. A non-finite value outside the sample is found when its chunk is
// sent: it reaches G (GradScaler sees it) and leaves P with the chunk.
//
// Cost per step and bucket of `count` floats with k chunks sent: a read of
// count/8 (sample), 2 x k chunks in P (copy out, zero), k chunks of G
// zeroed (last step's) and k written (unpack).
#include "sparse_pool_residual.h"

#include <algorithm>
#include <cstring>

#include "common.h"
#include "sparse_chunks.h"

namespace gradflow {

namespace {

std::atomic<int64_t> g_live_pool_elements{0};

// 16 blocks per chunk: smaller blocks spread the sample more but cost more
// per byte (prefetch and TLB misses per block): on 25.2 M floats in chunks
// of 32768, blocks of 512 / 1024 / 2048 / 4096 floats took 4.2 / 3.4 / 2.8 /
// 2.0 ms of thread CPU time against 8.1 ms for the full L1 norm
// (2026-11-25, load ~13, median of 9).
constexpr size_t kBlocksPerChunk = 16, kGroup = 8;

void chunk_bounds(uint32_t c, size_t count, size_t chunk_elems, size_t* begin, size_t* end) {
  GF_CHECK(c < num_chunks(count, chunk_elems),
           "sparse chunk index " << c << " out of range (" << count << " elements)");
  *begin = static_cast<size_t>(c) * chunk_elems;
  *end = std::min(*begin + chunk_elems, count);
}

}  // namespace

void sampled_chunk_importance(const float* values, size_t count, size_t chunk_elems,
                              std::vector<float>* importance, uint64_t phase) {
  const size_t n = num_chunks(count, chunk_elems);
  importance->assign(n, 0.0f);
  const size_t b = std::max<size_t>(1, chunk_elems / kBlocksPerChunk);
  for (size_t c = 0; c < n; ++c) {
    const size_t begin = c * chunk_elems, len = std::min(chunk_elems, count - begin);
    const size_t nblocks = (len + b - 1) / b;
    double sum = 0.0;
    size_t sampled = 0;
    for (size_t g = 0; g * kGroup < nblocks; ++g) {
      const size_t m = std::min(kGroup, nblocks - g * kGroup);
      const size_t j = g * kGroup + (c + 3 * g + phase % kGroup) % m;
      const size_t lo = j * b, hi = std::min(lo + b, len);
      sum += l1_norm(values + begin + lo, hi - lo);
      sampled += hi - lo;
    }
    (*importance)[c] = static_cast<float>(sum * static_cast<double>(len) /
                                          static_cast<double>(sampled));
  }
}

PoolResidual::PoolResidual(size_t count, size_t chunk_elems)
    : count_(count), chunk_elems_(chunk_elems) {
  GF_CHECK(chunk_elems > 0, "sparse chunk size must be > 0 elements (GRADFLOW_SPARSE_CHUNK)");
  g_live_pool_elements += static_cast<int64_t>(count);
}

PoolResidual::~PoolResidual() { g_live_pool_elements -= static_cast<int64_t>(count_); }

int64_t PoolResidual::live_elements() { return g_live_pool_elements.load(); }

void PoolResidual::clear_output(float* out) {
  if (all_ || dirty_.exchange(false)) {
    std::memset(out, 0, count_ * sizeof(float));
  } else {
    for (uint32_t c : written_) {
      size_t begin, end;
      chunk_bounds(c, count_, chunk_elems_, &begin, &end);
      std::memset(out + begin, 0, (end - begin) * sizeof(float));
    }
  }
  all_ = false;
  dirty_.store(false);
  written_.clear();
}

void PoolResidual::take_chunks(float* pool, const std::vector<uint32_t>& chunks,
                               float* packed) const {
  size_t out = 0;
  for (size_t j = 0; j < chunks.size(); ++j) {
    GF_CHECK(j == 0 || chunks[j - 1] < chunks[j], "sparse chunks must be ascending and distinct");
    size_t begin, end;
    chunk_bounds(chunks[j], count_, chunk_elems_, &begin, &end);
    std::memcpy(packed + out, pool + begin, (end - begin) * sizeof(float));
    std::memset(pool + begin, 0, (end - begin) * sizeof(float));
    out += end - begin;
  }
}

void PoolResidual::drop_chunks(float* pool, const std::vector<uint32_t>& chunks) const {
  for (uint32_t c : chunks) {
    size_t begin, end;
    chunk_bounds(c, count_, chunk_elems_, &begin, &end);
    std::memset(pool + begin, 0, (end - begin) * sizeof(float));
  }
}

}  // namespace gradflow
