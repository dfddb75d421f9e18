// fusion_buffer.h — tensor fusion for tensors outside a gradient pool:
// planning (a pure function: which consecutive responses share one
// collective) and pack/unpack into one contiguous buffer. Counts the bytes
// it copies so tests can prove the pool path copies nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"

namespace gradflow {

// What the planner needs to know about one agreed allreduce.
struct FusionItem {
  DataType dtype;
  ReduceOp op;
  WireDtype wire;
  double prescale;
  double postscale;
  size_t bytes;
  bool fusable;  // false for pool ranges (already contiguous) and sparse buffers
};

// Groups consecutive items (order preserved, see Note [Execution order]) whose
// dtype/op/wire/scales match, while the group stays <= threshold_bytes. An
// item larger than the threshold forms its own group. Returns group sizes.
std::vector<size_t> plan_fusion(const std::vector<FusionItem>& items, size_t threshold_bytes);

// A grow-only contiguous buffer with copy accounting.
class FusionBuffer {
 public:
  void* reserve(size_t bytes);
  void pack(size_t offset, const void* src, size_t bytes);
  void unpack(size_t offset, void* dst, size_t bytes) const;
  uint64_t bytes_copied() const { return bytes_copied_; }
  uint64_t copies() const { return copies_; }

 private:
  std::vector<uint8_t> data_;
  mutable uint64_t bytes_copied_ = 0;
  mutable uint64_t copies_ = 0;
};

}  // namespace gradflow
