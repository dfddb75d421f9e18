// tuning.h — applying autotune decisions (issue 16 target 7). The search
// itself is gradflow/autotune.py (rank 0, from measured step times); its
// decision travels as a broadcast from rank 0 of kTuningValues float64s
// named kTuningPrefix + <sample>. Every rank's background loop executes that
// broadcast at the same place in the agreed response order and applies the
// values right after it (BackgroundLoop::cycle), so the algorithm, ring
// piece size and cycle time change between the same two collectives on
// every rank, whatever else is in flight. The pool bucket size (index 3) is
// applied by the binding at its step boundary (Runtime::pool_rebucket).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common.h"

namespace gradflow {

constexpr const char* kTuningPrefix = "gradflow.autotune.";
// [allreduce algo code, ring piece bytes, cycle time ms, pool bucket bytes, final (0|1)]
constexpr size_t kTuningValues = 5;

struct Tuning {
  AllreduceAlgo algo = AllreduceAlgo::kRing;
  int64_t ring_pipeline_bytes = 1 << 20;
  double cycle_time_ms = 1.0;
  int64_t pool_bucket_bytes = 8 << 20;
};

// True if `name` is reserved for tuning broadcasts.
bool is_tuning_name(const std::string& name);
// Decodes and range-checks the broadcast values (the same ranges as the
// GRADFLOW_* settings). Throws GradflowError naming the bad value; the data
// is identical on every rank after the broadcast, so every rank throws alike.
Tuning decode_tuning(const double* values, size_t count);

}  // namespace gradflow
