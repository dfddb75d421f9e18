// executor_sparse.cc — the ResponseExecutor's coarse-grained sparse (CSC)
// steps: the classic one with a SparseResidual (ad-hoc sparse allreduces,
// the copy path, pools with grad_scaler= or sparse momentum) and the one
// whose residual lives in the gradient pool (Note [Residual in the pool],
// sparse_pool_residual.cc). The collectives themselves are allreduce_dense's.
#include "response_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "reduce_kernels.h"
#include "sparse_pool_residual.h"

namespace gradflow {
namespace {

// Chunks to send for `n` chunks at `ratio`: the same expression on every rank.
size_t chunks_to_send(double ratio, size_t n) {
  size_t k = static_cast<size_t>(std::ceil(ratio * static_cast<double>(n)));
  return std::max<size_t>(1, std::min(k, n));
}

// The auto policy's estimate of a dense send from a sparse step's two
// transfers: the importance allreduce ~ latency, the packed one ~ latency +
// bytes / bandwidth (sparse_auto_policy.h).
double dense_estimate(double latency_s, double packed_s, size_t count, size_t packed) {
  if (packed == 0) return 0.0;
  return latency_s + std::max(0.0, packed_s - latency_s) * static_cast<double>(count) /
                         static_cast<double>(packed);
}

// Every chunk, ascending: a bucket the auto policy sends dense.
std::vector<uint32_t> all_chunks(size_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0u);
  return v;
}

}  // namespace

SparseResidual* ResponseExecutor::sparse_residual(const Response& r, TensorEntry* e, size_t count,
                                                 std::unique_ptr<SparseResidual>* temp,
                                                 std::string* error) {
  const size_t chunk = static_cast<size_t>(cfg_.sparse_chunk);
  const float momentum = static_cast<float>(cfg_.sparse_momentum);
  if (r.in_pool) {
    // A pool bucket's residual belongs to its pool (api.cc): freed with the
    // pool, one per gradient element. A rank that has joined has no entry:
    // it contributes zeros, through a zero residual of its own.
    if (e && e->sparse_residual && e->sparse_residual->count() == count)
      return e->sparse_residual.get();
    *temp = std::make_unique<SparseResidual>(count, chunk, momentum);
    return temp->get();
  }
  // Ad-hoc allreduce(..., sparse_ratio=) and the optimizer's copy path: one
  // residual per name, kept for the life of the runtime.
  SparseState& st = sparse_[r.name];
  if (st.residual && st.residual->count() != count) {
    std::ostringstream m;
    m << "gradflow: allreduce '" << r.name << "' with sparse_ratio " << r.sparse_ratio << " has "
      << count << " elements, but earlier calls under this name had " << st.residual->count()
      << "; its sparse residual (gradient not sent yet) would be lost: give tensors of another "
         "size another name";
    *error = m.str();
    return nullptr;
  }
  if (!st.residual) st.residual = std::make_unique<SparseResidual>(count, chunk, momentum);
  if (e && e->rollback_residual) st.residual->rollback();  // the last step was skipped
  return st.residual.get();
}

SparseAutoPolicy* ResponseExecutor::auto_policy(const Response& r, size_t count) {
  if (!cfg_.sparse_policy_auto) return nullptr;
  std::unique_ptr<SparseAutoPolicy>& p = sparse_[r.name].policy;
  if (!p || p->count() != count)
    p = std::make_unique<SparseAutoPolicy>(count, cfg_.sparse_auto_costs);
  return p.get();
}

bool ResponseExecutor::sparse_warmup(const Response& r) {
  // Pools decide warm-up at submission (the request's sparse_ratio is 1 on
  // their warm-up steps); named residuals count their own steps here.
  if (r.in_pool) return false;
  return ++sparse_[r.name].steps <= cfg_.sparse_warmup_steps;
}

ResponseExecutor::ImportanceAgreement ResponseExecutor::agree_on_importance(
    std::vector<float>* importance, SparseAutoPolicy* policy, double t0, double* cpu_seconds,
    TransferStats* ts) {
  ImportanceAgreement a;
  if (policy) policy->append_costs(importance);
  *cpu_seconds += now_seconds() - t0;
  const double tr0 = ts->transfer_seconds;
  allreduce_dense(importance->data(), importance->size(), DataType::kFloat32, ReduceOp::kSum,
                  WireDtype::kNative, ts);
  a.transfer_s = ts->transfer_seconds - tr0;
  // Agreed data (the summed vector), so every rank decides the same.
  a.dense = policy && policy->decide_dense(importance);
  a.agreed_at = now_seconds();
  return a;
}

double ResponseExecutor::reduce_chosen_chunks(std::vector<float>* packed,
                                              const std::vector<uint32_t>& chosen, size_t count,
                                              size_t chunk, ReduceOp op, WireDtype wire,
                                              double postscale, float* dst, double t0,
                                              double* cpu_seconds, TransferStats* ts) {
  *cpu_seconds += now_seconds() - t0;
  const double tr0 = ts->transfer_seconds;
  allreduce_dense(packed->data(), packed->size(), DataType::kFloat32, op, wire, ts);
  const double transfer_s = ts->transfer_seconds - tr0;
  t0 = now_seconds();
  scale_buffer(packed->data(), packed->size(), DataType::kFloat32, postscale);
  unpack_chunks(packed->data(), count, chunk, chosen, dst);
  *cpu_seconds += now_seconds() - t0;
  return transfer_s;
}

void ResponseExecutor::allreduce_sparse(SparseResidual* res, float* buf, ReduceOp op,
                                        WireDtype wire, double ratio, double postscale,
                                        TransferStats* ts, SparseAutoPolicy* policy) {
  const size_t count = res->count(), chunk = res->chunk_elems();
  // CPU time of the sparse passes (absorb, select, commit, unpack) is
  // reported as codec time: like a wire conversion it is work the bytes
  // saved must pay for.
  double cpu_seconds = 0.0;
  double t0 = now_seconds();
  // 1. importance of residual + this step's gradient (written aside; buf is
  //    zeroed); every rank must choose the same chunks, so the per-rank L1
  //    norms are summed (a tiny allreduce).
  std::vector<float> importance;
  res->absorb(buf, &importance);
  const ImportanceAgreement agreed =
      agree_on_importance(&importance, policy, t0, &cpu_seconds, ts);
  const bool dense = agreed.dense;
  t0 = agreed.agreed_at;
  // 2. some rank overflowed (inf/NaN): send nothing, keep the residual as it
  //    was, hand every rank the same non-finite output (Note [Coarse-grained
  //    sparse communication], sparse_chunks.cc).
  if (any_non_finite(importance)) {
    mark_overflow(importance, count, chunk, buf);
    cpu_seconds += now_seconds() - t0;
    ts->codec_seconds += cpu_seconds;
    stats_.add("sparse.overflow_steps", 1);
    return;
  }
  // 3. the new residual takes effect; its chosen chunks (all of them when
  //    the auto policy sends the buffer dense) leave it, are reduced densely
  //    and unpacked into buf (zero elsewhere).
  std::vector<uint32_t> chosen =
      dense ? all_chunks(importance.size())
            : select_top_chunks(importance, chunks_to_send(ratio, importance.size()));
  std::vector<float> packed(packed_size(chosen, count, chunk));
  res->commit(chosen, packed.data());
  const double t_packed = reduce_chosen_chunks(&packed, chosen, count, chunk, op, wire, postscale,
                                               buf, t0, &cpu_seconds, ts);
  ts->codec_seconds += cpu_seconds;
  stats_.add("seconds_sparse", cpu_seconds);
  if (policy)
    policy->record(dense, now_seconds() - agreed.agreed_at,
                   dense_estimate(agreed.transfer_s, t_packed, count, packed.size()));
  if (dense) {
    stats_.add("sparse.buckets_sent_dense_by_policy", 1);
    return;
  }
  stats_.add("sparse.steps", 1);
  stats_.add("sparse.chunks_sent", static_cast<double>(chosen.size()));
  stats_.add("sparse.chunks_total", static_cast<double>(importance.size()));
}


void ResponseExecutor::allreduce_pool_residual(const Response& r, TensorEntry* e,
                                               TransferStats* ts) {
  PoolResidual* res = e->pool_residual.get();
  float* pool = static_cast<float*>(const_cast<void*>(e->input));
  float* out = static_cast<float*>(e->output);
  const size_t count = res->count(), chunk = res->chunk_elems();
  double post = r.postscale;
  if (r.op == ReduceOp::kAverage) post /= comm_.size();
  // All of P (residual + gradient) goes and leaves it: a dense warm-up step
  // (the pool's request says ratio 1) or the auto policy's dense send.
  // Passes over the buffer, but only on those steps.
  auto send_all = [&] {
    std::memcpy(out, pool, count * sizeof(float));
    std::memset(pool, 0, count * sizeof(float));
    scale_buffer(out, count, DataType::kFloat32, r.prescale);
    allreduce_dense(out, count, DataType::kFloat32, r.op, r.wire, ts);
    scale_buffer(out, count, DataType::kFloat32, post);
    res->set_written_all();
  };
  if (r.sparse_ratio >= 1.0) {
    send_all();
    return;
  }
  double t0 = now_seconds(), cpu_seconds = 0.0;
  // 1. estimated importance of P = residual + this step's gradients; the
  //    per-rank estimates are summed so every rank chooses the same chunks.
  std::vector<float> importance;
  sampled_chunk_importance(pool, count, chunk, &importance, res->next_phase());
  res->clear_output(out);
  SparseAutoPolicy* policy = auto_policy(r, count);
  const ImportanceAgreement agreed =
      agree_on_importance(&importance, policy, t0, &cpu_seconds, ts);
  t0 = agreed.agreed_at;
  // 2. overflow somewhere: nothing is sent (as on the classic path, so the
  //    collectives match a joined rank's); the non-finite chunks are
  //    marked in G and dropped from P (they cannot be restored).
  if (any_non_finite(importance)) {
    mark_overflow(importance, count, chunk, out);
    std::vector<uint32_t> bad;
    for (size_t c = 0; c < importance.size(); ++c)
      if (!std::isfinite(importance[c])) bad.push_back(static_cast<uint32_t>(c));
    res->drop_chunks(pool, bad);
    res->set_written(std::move(bad));
    cpu_seconds += now_seconds() - t0;
    ts->codec_seconds += cpu_seconds;
    stats_.add("seconds_sparse", cpu_seconds);
    stats_.add("sparse.overflow_steps", 1);
    return;
  }
  // 3. CSC does not pay on this bucket (Note [Auto sparse policy]): all of
  //    P goes, dense; nothing is held back or counted twice.
  if (agreed.dense) {
    ts->codec_seconds += cpu_seconds;
    stats_.add("seconds_sparse", cpu_seconds);
    send_all();
    policy->record(true, now_seconds() - agreed.agreed_at);
    stats_.add("sparse.buckets_sent_dense_by_policy", 1);
    return;
  }
  // 3. the chosen chunks leave P, are reduced densely and land in G.
  std::vector<uint32_t> chosen =
      select_top_chunks(importance, chunks_to_send(r.sparse_ratio, importance.size()));
  std::vector<float> packed(packed_size(chosen, count, chunk));
  res->take_chunks(pool, chosen, packed.data());
  scale_buffer(packed.data(), packed.size(), DataType::kFloat32, r.prescale);
  const double t_packed = reduce_chosen_chunks(&packed, chosen, count, chunk, r.op, r.wire, post,
                                               out, t0, &cpu_seconds, ts);
  stats_.add("sparse.chunks_sent", static_cast<double>(chosen.size()));
  res->set_written(std::move(chosen));
  ts->codec_seconds += cpu_seconds;
  stats_.add("seconds_sparse", cpu_seconds);
  if (policy)
    policy->record(false, now_seconds() - agreed.agreed_at,
                   dense_estimate(agreed.transfer_s, t_packed, count, packed.size()));
  stats_.add("sparse.steps", 1);
  stats_.add("sparse.in_pool_steps", 1);
  stats_.add("sparse.chunks_total", static_cast<double>(importance.size()));
}

}  // namespace gradflow
