// tuning.cc — decoding and validating an autotune decision (see tuning.h).
#include "tuning.h"

#include <cmath>
#include <sstream>

namespace gradflow {
namespace {

double checked(const double* v, size_t i, double lo, double hi, bool integer, const char* what) {
  double x = v[i];
  if (!std::isfinite(x) || x < lo || x > hi || (integer && x != std::floor(x))) {
    std::ostringstream m;
    m << "gradflow: autotune decision has invalid " << what << " " << x << " (accepted: " << lo
      << " <= value <= " << hi << (integer ? ", integer" : "") << ")";
    throw GradflowError(m.str());
  }
  return x;
}

}  // namespace

bool is_tuning_name(const std::string& name) { return name.rfind(kTuningPrefix, 0) == 0; }

Tuning decode_tuning(const double* values, size_t count) {
  GF_CHECK(count == kTuningValues, "gradflow: an autotune decision ('" << kTuningPrefix
                                       << "*' broadcast) must hold " << kTuningValues
                                       << " float64 values, got " << count);
  Tuning t;
  // Codes of AllreduceAlgo (common.h): ring, two-sync, mpi, auto.
  t.algo = static_cast<AllreduceAlgo>(static_cast<int>(checked(values, 0, 0, 5, true, "algorithm code")));
  t.ring_pipeline_bytes = static_cast<int64_t>(checked(values, 1, 1024, 1 << 30, true, "ring piece bytes"));
  t.cycle_time_ms = checked(values, 2, 0, 10000, false, "cycle time ms");
  t.pool_bucket_bytes = static_cast<int64_t>(checked(values, 3, 4096, 1e12, true, "pool bucket bytes"));
  checked(values, 4, 0, 1, true, "final flag");
  return t;
}

}  // namespace gradflow
