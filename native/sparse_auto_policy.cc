// sparse_auto_policy.cc — when a CSC bucket is sent dense under
// GRADFLOW_SPARSE_POLICY=auto. See Note [Auto sparse policy].
#include "sparse_auto_policy.h"

#include <algorithm>

namespace gradflow {

// Note [Auto sparse policy]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// CSC pays when the bytes it keeps off the wire take longer to send than
// its own CPU work (importance, selection, packing) costs. On a small,
// compute-heavy model or a fast link it may not. Under `auto` each CSC
// bucket compares, every step, the measured seconds of its two possible
// paths after the importance allreduce (which both paths run, so the
// collectives are the same whatever is decided until the data moves):
//   sparse: select top-k, take the chunks, packed allreduce, unpack;
//   dense:  take every chunk (residual + gradient: the whole bucket),
//           dense allreduce, scale.
// i.e. dense iff codec CPU + packed transfer > dense transfer, i.e. iff the
// codec costs more than the transfer time it saves. Sending dense takes the
// residual with it (everything held back leaves the residual and is sent
// once), so error feedback stays exact.
//
// The decision changes what goes on the wire, so it must be the same on
// every rank and may not come from one rank's clock. Each rank appends its
// two cost estimates to the chunk-importance vector, which is allreduced
// (summed) anyway; every rank then compares the same sums (= N x the ranks'
// mean costs) with the same step counters, which advance once per step of
// the bucket on every rank (a joined rank runs the same steps on zeros).
//
// Measuring: a bucket's first sparse step is not counted (first-touch
// allocations), its second is; then, unless a dense step was already
// measured, one dense step is sent as a probe, except while the dense cost
// estimated from the sparse step's own transfers (importance allreduce =
// latency, packed allreduce = latency + bytes / bandwidth) is at least
// kClearWin times the sparse cost: on a communication-heavy model a dense
// probe of a 64 MiB bucket would cost more than a whole sparse step.
// Costs are smoothed (mean of the new sample and the old estimate). In a
// run of dense steps, every kReprobeEvery-th step is sent sparse again to
// re-measure CSC (so a bucket returns to CSC when it pays again); a bucket
// that stays sparse re-measures its dense cost only when it is sent dense. GRADFLOW_SPARSE_AUTO_COSTS
// replaces a rank's measurements with fixed numbers, a list used in turn
// step by step (tests force both decisions, switches between them and
// unequal per-rank inputs with it); then nothing is probed.

SparseAutoPolicy::SparseAutoPolicy(size_t count, std::vector<std::pair<double, double>> fixed)
    : count_(count), fixed_(std::move(fixed)) {}

void SparseAutoPolicy::append_costs(std::vector<float>* importance) const {
  if (!fixed_.empty()) {
    const auto& c = fixed_[static_cast<size_t>(steps_) % fixed_.size()];
    importance->push_back(static_cast<float>(c.first));
    importance->push_back(static_cast<float>(c.second));
    importance->push_back(0.0f);
    return;
  }
  importance->push_back(static_cast<float>(sparse_s_));
  importance->push_back(static_cast<float>(dense_s_));
  importance->push_back(static_cast<float>(dense_est_));
}

bool SparseAutoPolicy::decide_dense(std::vector<float>* importance) {
  const float estimate_sum = importance->back();
  importance->pop_back();
  const float dense_sum = importance->back();
  importance->pop_back();
  const float sparse_sum = importance->back();
  importance->pop_back();
  const int64_t step = steps_++;
  const bool fixed = !fixed_.empty();
  bool dense;
  probe_ = true;
  if (!(sparse_sum > 0.0f)) {
    dense = false;  // CSC not measured (everywhere) yet
  } else if (!(dense_sum > 0.0f)) {
    // Dense not measured yet: one probe, unless CSC clearly pays.
    dense = !(estimate_sum >= kClearWin * sparse_sum);
    probe_ = dense;
  } else if (!fixed && last_sparse_step_ >= 0 && step - last_sparse_step_ >= kReprobeEvery) {
    dense = false;  // long dense run: does CSC pay again?
  } else {
    probe_ = false;
    dense = sparse_sum > dense_sum;
  }
  if (!dense) last_sparse_step_ = step;
  return dense;
}

void SparseAutoPolicy::record(bool dense, double seconds, double dense_estimate) {
  if (!fixed_.empty()) return;
  auto smooth = [](double* est, double x) {
    x = std::max(x, 1e-9);  // > 0 means "measured"
    *est = *est > 0 ? 0.5 * (*est + x) : x;
  };
  if (dense) return smooth(&dense_s_, seconds);
  if (sparse_samples_++ == 0) return;
  smooth(&sparse_s_, seconds);
  smooth(&dense_est_, dense_estimate);
}

}  // namespace gradflow
