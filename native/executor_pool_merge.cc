// executor_pool_merge.cc — the ResponseExecutor's merged pool collective:
// adjacent dense buckets of one pool that the plan joined (pool_merge.h) are
// reduced as one contiguous range of the pool, in place, in one collective.
#include <cstring>

#include "reduce_kernels.h"
#include "response_executor.h"
#include "sparse_pool_residual.h"

namespace gradflow {

void ResponseExecutor::run_pool_merged(const std::vector<const Response*>& group,
                                       const std::vector<TensorEntry*>& entries,
                                       std::vector<HandleResult>* results) {
  const Response& first = *group[0];
  const DataType dt = first.dtype;
  const size_t esize = dtype_size(dt);
  std::vector<size_t> bytes;
  size_t total = 0;
  for (const Response* r : group) {
    size_t n = 1;
    for (int64_t d : r->shape) n *= static_cast<size_t>(d);
    bytes.push_back(n * esize);
    total += n;
  }
  stats_.add("allreduce.bytes_input", static_cast<double>(total * esize));
  // A CSC pool on a dense warm-up step (residual in the pool, Note [Residual
  // in the pool]): all of P moves to G and leaves P, as
  // allreduce_pool_residual's dense branch does per bucket.
  for (size_t i = 0; i < group.size(); ++i) {
    TensorEntry* e = entries[i];
    if (!e || e->input == e->output) continue;
    std::memcpy(e->output, e->input, bytes[i]);
    if (e->pool_residual) std::memset(const_cast<void*>(e->input), 0, bytes[i]);
    stats_.add("copy_in_bytes", static_cast<double>(bytes[i]));
  }
  // The buckets are adjacent in the pool by construction (GradPool), so the
  // union is one range: reduce it where it lies. A rank that has joined (no
  // entries) packs zeros instead; the collective on the wire is the same
  // either way, so this local choice never changes what peers see.
  bool contiguous = true;
  size_t off = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    contiguous = contiguous && entries[i] &&
                 static_cast<uint8_t*>(entries[i]->output) ==
                     static_cast<uint8_t*>(entries[0]->output) + off;
    off += bytes[i];
  }
  const uint64_t copied_before = fusion_.bytes_copied();
  void* work = nullptr;
  if (contiguous) {
    work = entries[0]->output;
  } else {
    work = fusion_.reserve(total * esize);
    off = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      if (entries[i]) fusion_.pack(off, entries[i]->output, bytes[i]);
      else std::memset(static_cast<uint8_t*>(work) + off, 0, bytes[i]);
      off += bytes[i];
    }
  }
  TransferStats ts;
  scale_buffer(work, total, dt, first.prescale);
  double post = first.postscale;
  if (first.op == ReduceOp::kAverage) post /= comm_.size();
  allreduce_dense(work, total, dt, first.op, first.wire, &ts);
  scale_buffer(work, total, dt, post);
  if (!contiguous) {
    off = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      if (entries[i]) fusion_.unpack(off, entries[i]->output, bytes[i]);
      off += bytes[i];
    }
  }
  for (TensorEntry* e : entries)
    if (e && e->pool_residual) e->pool_residual->set_written_all();
  stats_.add("fusion.bytes_copied", static_cast<double>(fusion_.bytes_copied() - copied_before));
  stats_.add("pool.merged_collectives", 1);
  stats_.add("pool.merged_buckets", static_cast<double>(group.size()));
  for (auto& r : *results) r.wire_overflow = ts.wire_overflow;
  last_.transfer = ts;
  last_.sparse = false;
}

}  // namespace gradflow
