// sparse_auto_policy.h — the `auto` sparse policy (GRADFLOW_SPARSE_POLICY,
// issue 16 target 3): per CSC bucket, send it dense when CSC does not pay
// (its measured CPU cost above the transfer time it saves). Pure
// bookkeeping: no MPI, no configuration, no clock (the executor measures and
// hands in seconds). See Note [Auto sparse policy] in the .cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gradflow {

class SparseAutoPolicy {
 public:
  // Floats append_costs() adds to the importance vector.
  static constexpr size_t kExtra = 3;
  // A bucket in a dense run is sent sparse again (a probe) every this many
  // steps: often enough that one noisy CSC measurement cannot hold a bucket
  // dense for long, rarely enough that probes cost little where dense wins.
  static constexpr int64_t kReprobeEvery = 8;
  // No dense probe while the estimated dense cost is at least this many
  // times the sparse cost (CSC clearly pays: a 100 MB probe is not free).
  static constexpr double kClearWin = 4.0;

  // `count`: the bucket's elements (a new bucket of another size under the
  // same name gets a fresh policy). A non-empty `fixed` (sparse, dense)
  // seconds list replaces this rank's measurements, step i using pair
  // i mod size (GRADFLOW_SPARSE_AUTO_COSTS, for tests); then nothing is probed.
  SparseAutoPolicy(size_t count, std::vector<std::pair<double, double>> fixed);

  size_t count() const { return count_; }

  // Before the importance allreduce: appends this rank's cost estimates
  // (seconds of the sparse and of the dense path after the importance
  // allreduce, 0 = not measured yet; and the dense path's estimate from the
  // sparse step's transfers).
  void append_costs(std::vector<float>* importance) const;

  // After the importance allreduce (summed over ranks, identical on every
  // rank): removes the kExtra summed costs and returns true if this step
  // sends the whole bucket dense. A function of the summed vector and of
  // step counters that advance once per call on every rank alike, so every
  // rank decides the same.
  bool decide_dense(std::vector<float>* importance);

  // This rank's measured seconds of the path this step took (after the
  // importance allreduce). A sparse step also gives `dense_estimate`:
  // latency + (packed transfer - latency) x (bucket / packed bytes), the
  // latency being the importance allreduce's time (over-estimated when a
  // peer arrived late, which lowers the estimate: more probes, never fewer).
  // Ignored with fixed costs.
  void record(bool dense, double seconds, double dense_estimate = 0.0);

  // True if the last decision was a probe (measuring, not choosing).
  bool last_was_probe() const { return probe_; }

 private:
  size_t count_;
  std::vector<std::pair<double, double>> fixed_;
  double sparse_s_ = 0.0, dense_s_ = 0.0;  // this rank's smoothed costs
  double dense_est_ = 0.0;                 // smoothed dense estimate from sparse steps
  int64_t sparse_samples_ = 0;             // sparse measurements seen (the first is dropped)
  int64_t steps_ = 0;                      // decide_dense calls
  int64_t last_sparse_step_ = -1;          // step of the last sparse send
  bool probe_ = false;
};

}  // namespace gradflow
