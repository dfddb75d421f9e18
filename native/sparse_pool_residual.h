// sparse_pool_residual.h — CSC with the error-feedback residual kept inside
// the gradient pool itself (issue 16): per-step CPU work proportional to the
// chunks sent, not to the buffer. See Note [Residual in the pool] in the .cc.
// Pure computation and bookkeeping: no MPI, no configuration, no threads of
// its own (the executor calls it on the background thread; only the dirty
// flag is set from a framework thread, between steps).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradflow {

// Estimated importance of each chunk of `values` (count elements, chunks of
// chunk_elems): the L1 norm of a sample of the chunk, scaled by
// (chunk length / sample length). The sample depends only on (count,
// chunk_elems, chunk index, phase), so every rank reads the same positions.
// Rule: blocks of b = max(1, chunk_elems / 16) elements; each group of 8
// consecutive blocks of a chunk (the last group may have m < 8) contributes
// block 8g + ((c + 3g + phase) mod m) — 1/8 of the chunk in two pieces
// (default chunk: 2 x 8 KiB), at positions that move from chunk to chunk
// and, with the phase (the bucket's sparse step count), from step to step:
// every element is sampled at least once every 8 steps, so a chunk whose
// residual grows outside one fixed sample cannot wait for ever.
void sampled_chunk_importance(const float* values, size_t count, size_t chunk_elems,
                              std::vector<float>* importance, uint64_t phase = 0);

// One pool bucket's state. The residual itself is the pool range P (the
// caller's memory, which autograd accumulates into); the reduced chunks go
// to a second range G of the same size (the optimizer's param.grad), of
// which only the chunks written last time are re-zeroed.
class PoolResidual {
 public:
  PoolResidual(size_t count, size_t chunk_elems);
  ~PoolResidual();
  PoolResidual(const PoolResidual&) = delete;
  PoolResidual& operator=(const PoolResidual&) = delete;
  // Elements held by live in-pool residuals in the process (tests).
  static int64_t live_elements();

  size_t count() const { return count_; }
  size_t chunk_elems() const { return chunk_elems_; }
  // The sample phase of this step (sampled_chunk_importance), then advanced:
  // one per sparse step, the same on every rank of the bucket.
  uint64_t next_phase() { return phase_++; }

  // Someone else wrote into G (the binding saw its version counter move):
  // the next clear_output zeroes all of it. Any thread, between steps.
  void mark_output_dirty() { dirty_.store(true); }
  // Makes G zero: last write's chunks, or everything if dirty / unknown.
  void clear_output(float* out);
  // Copies the chosen chunks (ascending) of the pool P into `packed` and
  // zeroes them in P: they leave the residual.
  void take_chunks(float* pool, const std::vector<uint32_t>& chunks, float* packed) const;
  // Zeroes the given chunks of P (dropped: an overflow step's non-finite chunks).
  void drop_chunks(float* pool, const std::vector<uint32_t>& chunks) const;
  // What G holds besides zeros after this step (re-zeroed next time).
  void set_written(std::vector<uint32_t> chunks) { written_ = std::move(chunks); all_ = false; }
  void set_written_all() { all_ = true; }

 private:
  size_t count_, chunk_elems_;
  std::vector<uint32_t> written_;  // chunks of G that may be non-zero
  uint64_t phase_ = 0;             // sparse steps so far (the sample's phase)
  bool all_ = true;                // G may be non-zero anywhere (initially: step 1's copy)
  std::atomic<bool> dirty_{false};
};

}  // namespace gradflow
