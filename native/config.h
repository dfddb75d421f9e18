// config.h — every GRADFLOW_* setting: its name, launcher flag, type, range
// and default (config_keys(), which the launcher and docs read), and the
// validated Config snapshot taken at init(). config.cc is the only getenv site.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace gradflow {

struct Config {
  int64_t fusion_threshold_bytes = 64ll << 20;  // GRADFLOW_FUSION_THRESHOLD
  int64_t pool_bucket_bytes = 8ll << 20;        // GRADFLOW_POOL_BUCKET_BYTES
  int64_t pool_first_bucket_bytes = 0;          // GRADFLOW_POOL_FIRST_BUCKET_BYTES (0 = off)
  bool pool_merge = true;                       // GRADFLOW_POOL_MERGE
  double cycle_time_ms = 1.0;                   // GRADFLOW_CYCLE_TIME
  double idle_cycle_max_ms = 20.0;              // GRADFLOW_IDLE_CYCLE_MAX
  int64_t cache_capacity = 1024;                // GRADFLOW_CACHE_CAPACITY
  double timeout_seconds = 60.0;                // GRADFLOW_TIMEOUT
  double init_timeout_seconds = 300.0;          // GRADFLOW_INIT_TIMEOUT (init_watchdog.h)
  double stall_check_seconds = 60.0;            // GRADFLOW_STALL_CHECK_TIME (0 = off)
  double stall_shutdown_seconds = 0.0;          // GRADFLOW_STALL_SHUTDOWN_TIME (0 = off)
  WireDtype wire_dtype = WireDtype::kNative;    // GRADFLOW_WIRE_DTYPE
  AllreduceAlgo allreduce_algo = AllreduceAlgo::kRing;  // GRADFLOW_ALLREDUCE_ALGO
  int64_t ring_pipeline_bytes = 1ll << 20;      // GRADFLOW_RING_PIPELINE_BYTES
  int64_t sparse_chunk = 32768;                 // GRADFLOW_SPARSE_CHUNK (elements)
  double sparse_ratio = 1.0;                    // GRADFLOW_SPARSE_RATIO (1 = dense)
  int64_t sparse_warmup_steps = 0;              // GRADFLOW_SPARSE_WARMUP_STEPS
  double sparse_momentum = 0.0;                 // GRADFLOW_SPARSE_MOMENTUM (0 = off)
  bool sparse_policy_auto = true;               // GRADFLOW_SPARSE_POLICY (auto | always)
  // GRADFLOW_SPARSE_AUTO_COSTS: fixed (sparse, dense) seconds per bucket
  // step, used in turn (empty = measure).
  std::vector<std::pair<double, double>> sparse_auto_costs;
  std::string timeline;                         // GRADFLOW_TIMELINE
  bool timeline_mark_cycles = false;            // GRADFLOW_TIMELINE_MARK_CYCLES
  std::string log_level = "warning";            // GRADFLOW_LOG_LEVEL
  // Autotune (gradflow/autotune.py searches; native/tuning.h applies).
  bool autotune = false;                        // GRADFLOW_AUTOTUNE
  std::string autotune_log;                     // GRADFLOW_AUTOTUNE_LOG
  int64_t autotune_warmup_samples = 3;          // GRADFLOW_AUTOTUNE_WARMUP_SAMPLES
  int64_t autotune_steps_per_sample = 10;       // GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE
};

// One setting as the launcher and the docs see it.
struct ConfigKey {
  std::string env;       // GRADFLOW_FUSION_THRESHOLD
  std::string flag;      // --fusion-threshold-mb
  std::string type;      // "int", "float", "choice", "string", "bool" (a flag without value)
  std::string default_value;  // in the env variable's unit
  std::string help;      // one line, including the accepted range
  double flag_to_env_scale;   // env value = flag value * scale (MiB -> bytes: 1048576)
  std::vector<std::string> choices;  // for "choice"
};

const std::vector<ConfigKey>& config_keys();

// Reads GRADFLOW_* from the environment, then applies `overrides` (same env
// names). Throws GradflowError naming the setting, the bad value and the
// accepted range.
Config load_config(const std::map<std::string, std::string>& overrides);

WireDtype parse_wire_dtype(const std::string& s);        // fp32|fp16|bf16 (throws)
AllreduceAlgo parse_allreduce_algo(const std::string& s);  // ring|two-sync|mpi|auto (throws)

}  // namespace gradflow
