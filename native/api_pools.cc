// api_pools.cc — Runtime's gradient-pool methods (moved out of api.cc, no
// behaviour change): creating a pool, submitting its buckets as ordinary
// allreduces (SubmitArgs from the pool's template, with its CSC residuals),
// and the per-step bookkeeping the bindings call (python_pool_bindings.cc).
// The pools themselves are grad_pool.*; their buckets' reduction is the
// executor's (executor_pool_merge.cc).
#include "api.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reduce_kernels.h"

namespace gradflow {

namespace {
// A pool id is (runtime generation << kPoolIndexBits) | index: an id made by
// a runtime since shut down is refused, not mistaken for a new pool.
constexpr int kPoolIndexBits = 32;
}  // namespace

int64_t Runtime::pool_create(uintptr_t data, DataType dt, const std::vector<int64_t>& range_elems,
                             int64_t bucket_bytes, ReduceOp op, int wire, double prescale,
                             double postscale, double sparse_ratio, uintptr_t output) {
  std::string why;
  GF_CHECK_ARG(op != ReduceOp::kAdasum,
               "gradflow: gradient pools do not support op=Adasum (a bucket holds several "
               "gradients, each needing its own dot products); submit the gradients one by one");
  GF_CHECK(reduce_supported(dt, op, &why), "gradflow: gradient pool: " << why);
  const double ratio = sparse_ratio < 0 ? cfg_.sparse_ratio : sparse_ratio;
  const bool sparse = ratio < 1.0 && dt == DataType::kFloat32;
  GF_CHECK_ARG(output == 0 || (sparse && cfg_.sparse_momentum == 0.0),
               "gradflow: a gradient pool keeps its residual in place only for CSC on float32 "
               "without GRADFLOW_SPARSE_MOMENTUM");
  std::lock_guard<std::mutex> lock(pools_mu_);
  int index = next_pool_++;
  int64_t id = (generation_ << kPoolIndexBits) | index;
  PoolState& p = pools_[id];
  size_t bb = bucket_bytes < 0 ? static_cast<size_t>(cfg_.pool_bucket_bytes)
                               : static_cast<size_t>(bucket_bytes);
  // The index, not the id, names the buckets: ranks agree on it whatever
  // each process did before this runtime.
  p.pool = std::make_unique<GradPool>(index, reinterpret_cast<void*>(data), dt, range_elems, bb,
                                      static_cast<size_t>(cfg_.pool_first_bucket_bytes));
  SubmitArgs& t = p.bucket_template;
  t.kind = OpKind::kAllreduce;
  t.dtype = dt;
  t.op = op;
  t.wire = wire;
  t.prescale = prescale;
  t.postscale = postscale;
  t.sparse_ratio = sparse_ratio;
  t.in_pool = true;
  // Sparse pools own their error-feedback residuals, one per bucket (one
  // float per gradient element): freed with the pool, never keyed by name.
  if (output != 0) {
    p.output = reinterpret_cast<uint8_t*>(output);
    for (size_t b = 0; b < p.pool->num_buckets(); ++b)
      p.pool_residuals.push_back(std::make_shared<PoolResidual>(
          p.pool->bucket_elems(static_cast<int>(b)), static_cast<size_t>(cfg_.sparse_chunk)));
  } else if (sparse)
    for (size_t b = 0; b < p.pool->num_buckets(); ++b)
      p.residuals.push_back(std::make_shared<SparseResidual>(
          p.pool->bucket_elems(static_cast<int>(b)), static_cast<size_t>(cfg_.sparse_chunk),
          static_cast<float>(cfg_.sparse_momentum)));
  return id;
}

Runtime::PoolState& Runtime::find_pool(int64_t id) {
  GF_CHECK((id >> kPoolIndexBits) == generation_,
           "gradflow: gradient pool " << id << " belongs to a gradflow runtime that has been shut "
           "down (shutdown() and init() were called since it was created, or its process set "
           "was removed); create the DistributedOptimizer (or model wrapper) again after init()");
  auto it = pools_.find(id);
  GF_CHECK(it != pools_.end(), "gradflow: unknown gradient pool " << id);
  return it->second;
}

int64_t Runtime::submit_bucket(PoolState& p, int b) {
  SubmitArgs a = p.bucket_template;
  a.name = p.pool->bucket_name(b);
  a.input = a.output = reinterpret_cast<uintptr_t>(p.pool->bucket_data(b));
  a.shape = {static_cast<int64_t>(p.pool->bucket_elems(b))};
  if (!p.pool_residuals.empty()) {
    a.pool_residual = p.pool_residuals[b];
    a.output = reinterpret_cast<uintptr_t>(p.output + p.pool->bucket_offset(b) * sizeof(float));
  }
  if (!p.residuals.empty() || !p.pool_residuals.empty()) {
    if (!p.residuals.empty()) a.sparse_residual = p.residuals[b];
    // Warm-up counts the pool's steps; every rank's pool has run as many.
    if (p.steps < cfg_.sparse_warmup_steps) {
      a.sparse_ratio = 1.0;
      stats_.add("sparse.dense_warmup_steps", 1);
    }
  }
  int64_t h = submit(a);
  return h;
}

int64_t Runtime::pool_mark_ready(int64_t pool, int64_t range) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  int b = p.pool->mark_ready(static_cast<size_t>(range));
  return b < 0 ? -1 : submit_bucket(p, b);
}

std::vector<int64_t> Runtime::pool_flush(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  std::vector<int64_t> handles;
  for (int b : p.pool->take_unsubmitted()) handles.push_back(submit_bucket(p, b));
  return handles;
}

void Runtime::pool_reset(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  p.pool->reset();
  p.steps++;
}

void Runtime::pool_set_scale(int64_t pool, double prescale, double postscale) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  p.bucket_template.prescale = prescale;
  p.bucket_template.postscale = postscale;
}

void Runtime::pool_set_step_tag(int64_t pool, const std::string& tag) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  find_pool(pool).bucket_template.step_tag = tag;
}

void Runtime::pool_rollback_residuals(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  for (auto& r : find_pool(pool).residuals)
    if (r) r->rollback();
}

void Runtime::pool_output_dirty(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  for (auto& r : find_pool(pool).pool_residuals) r->mark_output_dirty();
}

void Runtime::pool_destroy(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  pools_.erase(pool);  // an id of another runtime is never a key here
}

void Runtime::pool_rebucket(int64_t pool, int64_t bucket_bytes) {
  GF_CHECK_ARG(bucket_bytes >= 4096, "gradflow: pool bucket size must be >= 4096 bytes, got "
                                         << bucket_bytes);
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  GF_CHECK_ARG(p.residuals.empty(),
               "gradflow: a sparse gradient pool with separate residuals "
               "(GRADFLOW_SPARSE_MOMENTUM) cannot change its bucket size");
  p.pool->recut(static_cast<size_t>(bucket_bytes));
  if (!p.pool_residuals.empty()) {
    // New bookkeeping per bucket: the residual itself is the pool (kept);
    // a fresh PoolResidual zeroes all of its output range next step.
    p.pool_residuals.clear();
    for (size_t b = 0; b < p.pool->num_buckets(); ++b)
      p.pool_residuals.push_back(std::make_shared<PoolResidual>(
          p.pool->bucket_elems(static_cast<int>(b)), static_cast<size_t>(cfg_.sparse_chunk)));
  }
}

std::vector<std::string> Runtime::pool_open_bucket_names(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  std::vector<std::string> out;
  for (int b : p.pool->unsubmitted()) out.push_back(p.pool->bucket_name(b));
  return out;
}

std::vector<int64_t> Runtime::pool_bucket_offsets(int64_t pool) {
  std::lock_guard<std::mutex> lock(pools_mu_);
  PoolState& p = find_pool(pool);
  std::vector<int64_t> out;
  for (size_t b = 0; b < p.pool->num_buckets(); ++b)
    out.push_back(static_cast<int64_t>(p.pool->bucket_offset(static_cast<int>(b))));
  return out;
}

}  // namespace gradflow
