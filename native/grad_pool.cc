// grad_pool.cc — bucket planning and readiness tracking for the gradient pool.
#include "grad_pool.h"

#include <algorithm>

namespace gradflow {

GradPool::GradPool(int id, void* data, DataType dt, const std::vector<int64_t>& range_elems,
                   size_t bucket_bytes, size_t first_bucket_bytes)
    : id_(id), data_(static_cast<uint8_t*>(data)), dtype_(dt),
      first_bucket_bytes_(first_bucket_bytes) {
  size_t offset = 0;
  for (int64_t e : range_elems) {
    GF_CHECK(e >= 0, "gradflow: negative range size in gradient pool");
    range_offset_.push_back(offset);
    range_elems_.push_back(static_cast<size_t>(e));
    offset += static_cast<size_t>(e);
  }
  cut_buckets(bucket_bytes);
  reset();
}

void GradPool::cut_buckets(size_t bucket_bytes) {
  const size_t esize = dtype_size(dtype_);
  size_t bucket_bytes_so_far = 0;
  bucket_first_range_.clear();
  bucket_num_ranges_.clear();
  range_bucket_.clear();
  for (size_t r = 0; r < range_elems_.size(); ++r) {
    size_t elems = range_elems_[r];
    const size_t cap = bucket_first_range_.size() == 1 && first_bucket_bytes_ > 0
                           ? std::min(first_bucket_bytes_, bucket_bytes)
                           : bucket_bytes;
    bool start_new = bucket_first_range_.empty() ||
                     (bucket_bytes_so_far > 0 && bucket_bytes_so_far + elems * esize > cap);
    if (start_new) {
      bucket_first_range_.push_back(r);
      bucket_num_ranges_.push_back(0);
      bucket_bytes_so_far = 0;
    }
    bucket_num_ranges_.back()++;
    bucket_bytes_so_far += elems * esize;
    range_bucket_.push_back(static_cast<int>(bucket_first_range_.size() - 1));
  }
}

void GradPool::recut(size_t bucket_bytes) {
  for (size_t r = 0; r < range_ready_.size(); ++r)
    GF_CHECK(!range_ready_[r], "gradflow: gradient pool " << id_ << " cannot be cut anew in the "
                                                            "middle of a step (range " << r
                                                            << " is already marked ready)");
  cut_buckets(bucket_bytes);
  cut_++;
  reset();
}

void GradPool::reset() {
  ready_count_.assign(bucket_first_range_.size(), 0);
  range_ready_.assign(range_offset_.size(), false);
  bucket_submitted_.assign(bucket_first_range_.size(), false);
}

int GradPool::mark_ready(size_t r) {
  GF_CHECK(r < range_offset_.size(), "gradflow: gradient pool range " << r << " out of range");
  GF_CHECK(!range_ready_[r], "gradflow: gradient " << r << " of pool " << id_
                                                     << " was produced twice in one step; set "
                                                        "backward_passes_per_step for gradient "
                                                        "accumulation");
  range_ready_[r] = true;
  int b = range_bucket_[r];
  if (++ready_count_[b] == bucket_num_ranges_[b] && !bucket_submitted_[b]) {
    bucket_submitted_[b] = true;
    return b;
  }
  return -1;
}

std::vector<int> GradPool::take_unsubmitted() {
  std::vector<int> out;
  for (size_t b = 0; b < bucket_submitted_.size(); ++b) {
    if (!bucket_submitted_[b]) {
      bucket_submitted_[b] = true;
      out.push_back(static_cast<int>(b));
    }
  }
  return out;
}

std::vector<int> GradPool::unsubmitted() const {
  std::vector<int> out;
  for (size_t b = 0; b < bucket_submitted_.size(); ++b)
    if (!bucket_submitted_[b]) out.push_back(static_cast<int>(b));
  return out;
}

size_t GradPool::bucket_offset(int b) const { return range_offset_[bucket_first_range_[b]]; }

size_t GradPool::bucket_elems(int b) const {
  size_t last = bucket_first_range_[b] + bucket_num_ranges_[b] - 1;
  return range_offset_[last] + range_elems_[last] - bucket_offset(b);
}

void* GradPool::bucket_data(int b) const {
  return data_ + bucket_offset(b) * dtype_size(dtype_);
}

std::string GradPool::bucket_name(int b) const {
  return "gradflow.pool" + std::to_string(id_) + (cut_ ? ".cut" + std::to_string(cut_) : "") +
         ".bucket" + std::to_string(b);
}

}  // namespace gradflow
