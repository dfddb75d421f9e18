// fusion_buffer.cc — tensor fusion for tensors outside a gradient pool: the
// pure planner (which consecutive agreed allreduces share one collective) and
// the grow-only staging buffer that counts every byte it copies.
// Must not communicate, read configuration or reorder items.
//
// Glossary: an *item* is one agreed allreduce (a response from the
// coordinator); a *group* is a run of consecutive items reduced by one
// collective over the fusion buffer. Items are never reordered: every rank
// plans from the same ordered list with the same threshold, so every rank
// forms the same groups (Note [Execution order] in coordinator.h).
#include "fusion_buffer.h"

#include <cstring>

namespace gradflow {

namespace {

// Items that can share one collective: same element type, reduction, wire
// format and scale factors (compared exactly; a NaN scale never matches).
bool same_collective(const FusionItem& a, const FusionItem& b) {
  return a.dtype == b.dtype && a.op == b.op && a.wire == b.wire && a.prescale == b.prescale &&
         a.postscale == b.postscale;
}

}  // namespace

std::vector<size_t> plan_fusion(const std::vector<FusionItem>& items, size_t threshold_bytes) {
  std::vector<size_t> groups;
  size_t i = 0;
  while (i < items.size()) {
    const FusionItem& first = items[i];
    size_t len = 1;
    size_t bytes = first.bytes;
    // A non-fusable item, an item over the threshold, or threshold 0 (fusion
    // off) makes a group of one.
    if (first.fusable && threshold_bytes > 0 && first.bytes <= threshold_bytes) {
      while (i + len < items.size()) {
        const FusionItem& next = items[i + len];
        if (!next.fusable || !same_collective(first, next)) break;
        if (next.bytes > threshold_bytes - bytes) break;  // bytes <= threshold: no underflow
        bytes += next.bytes;
        ++len;
      }
    }
    groups.push_back(len);
    i += len;
  }
  return groups;
}

void* FusionBuffer::reserve(size_t bytes) {
  // Grow only: after warm-up the pointer stays stable and nothing reallocates.
  if (data_.size() < bytes) data_.resize(bytes);
  return data_.data();
}

void FusionBuffer::pack(size_t offset, const void* src, size_t bytes) {
  GF_CHECK(offset <= data_.size() && bytes <= data_.size() - offset,
           "fusion buffer overflow: packing " << bytes << " bytes at offset " << offset
                                              << " into a buffer of " << data_.size()
                                              << " bytes (reserve first)");
  if (bytes == 0) return;  // a zero-byte pack is not a copy
  std::memcpy(data_.data() + offset, src, bytes);
  bytes_copied_ += bytes;
  ++copies_;
}

void FusionBuffer::unpack(size_t offset, void* dst, size_t bytes) const {
  GF_CHECK(offset <= data_.size() && bytes <= data_.size() - offset,
           "fusion buffer overrun: unpacking " << bytes << " bytes at offset " << offset
                                               << " from a buffer of " << data_.size()
                                               << " bytes");
  if (bytes == 0) return;
  std::memcpy(dst, data_.data() + offset, bytes);
  bytes_copied_ += bytes;
  ++copies_;
}

}  // namespace gradflow
