// grad_pool.h — the contiguous gradient pool behind lazy allreduce.
// Gradients of one dtype live in one buffer, laid out in backward order;
// the pool is cut once into buckets of whole ranges (<= bucket_bytes, a
// larger range is a bucket of its own). When the last range of a bucket is
// marked ready the bucket is allreduced in place, straight from the pool:
// no fusion-buffer copy. Pure bookkeeping: submission is the api's job.
//
// Invariants: bucket boundaries depend only on (range sizes, bucket_bytes),
// identical on every rank given the same layout; each bucket is submitted
// exactly once per step (mark_ready or flush), then reset() starts a step.
// recut() (autotune) cuts the same ranges again at a step boundary; the
// buckets of cut k > 0 are named "...cut<k>.bucket<b>", so a name never
// changes its size and the coordinator's cached responses stay valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace gradflow {

class GradPool {
 public:
  // `first_bucket_bytes` > 0 caps the first bucket (the last layers, whose
  // gradients backward produces first) below `bucket_bytes`, as DDP's 1 MiB
  // first bucket: a model smaller than one bucket then still starts
  // reducing during backward (GRADFLOW_POOL_FIRST_BUCKET_BYTES; 0 = off).
  GradPool(int id, void* data, DataType dt, const std::vector<int64_t>& range_elems,
           size_t bucket_bytes, size_t first_bucket_bytes = 0);

  // Marks range `r` ready. Returns the bucket index if that completed a
  // bucket not yet submitted, else -1. Marking a range twice in a step
  // throws (the same gradient produced twice needs backward_passes_per_step).
  int mark_ready(size_t r);
  // Buckets not yet submitted this step (in layout order); marks them submitted.
  std::vector<int> take_unsubmitted();
  // Buckets not yet submitted this step, without marking them (a failed
  // step withdraws their names: Note [A failed step], optimizer_step.py).
  std::vector<int> unsubmitted() const;
  void reset();
  // Cuts the buckets anew for `bucket_bytes`. Only between steps: throws if
  // a range was marked ready since reset().
  void recut(size_t bucket_bytes);
  int cut() const { return cut_; }

  size_t num_buckets() const { return bucket_first_range_.size(); }
  size_t num_ranges() const { return range_offset_.size(); }
  // Bucket b covers elements [bucket_offset(b), bucket_offset(b) + bucket_elems(b)).
  size_t bucket_offset(int b) const;
  size_t bucket_elems(int b) const;
  void* bucket_data(int b) const;
  std::string bucket_name(int b) const;
  DataType dtype() const { return dtype_; }
  int bucket_of_range(size_t r) const { return range_bucket_[r]; }

 private:
  void cut_buckets(size_t bucket_bytes);

  int id_;
  int cut_ = 0;  // recut() calls so far
  uint8_t* data_;
  DataType dtype_;
  size_t first_bucket_bytes_ = 0;  // 0: the first bucket is cut like the others
  std::vector<size_t> range_offset_, range_elems_;
  std::vector<int> range_bucket_;
  std::vector<size_t> bucket_first_range_, bucket_num_ranges_;
  std::vector<size_t> ready_count_;
  std::vector<bool> range_ready_, bucket_submitted_;
};

}  // namespace gradflow
