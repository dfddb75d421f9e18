// config.cc — the only place that reads GRADFLOW_* environment variables.
// Each setting is declared once in kKeys (name, flag, range, default); the
// parser, the launcher (via config_keys()) and the docs all derive from it.
#include "config.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace gradflow {
namespace {

// How one setting is parsed into Config. `lo`/`hi` bound numeric values.
struct KeySpec {
  ConfigKey key;
  double lo, hi;
  std::function<void(Config&, const std::string&)> apply;
};

[[noreturn]] void reject(const ConfigKey& key, const std::string& value, const std::string& why) {
  throw GradflowError("gradflow: invalid value '" + value + "' for " + key.env + " (" + key.flag +
                      "): " + why + ". Accepted: " + key.help);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e18) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

double parse_number(const KeySpec& spec, const std::string& value, bool integer) {
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end == value.c_str() || *end != '\0' || !std::isfinite(v))
    reject(spec.key, value, "not a number");
  if (integer && v != std::floor(v)) reject(spec.key, value, "not an integer");
  // The bounds themselves, not only the help text (which may say less).
  if (v < spec.lo || v > spec.hi)
    reject(spec.key, value,
           "out of range " + number_text(spec.lo) + " <= value <= " + number_text(spec.hi));
  return v;
}

std::vector<KeySpec> make_specs() {
  std::vector<KeySpec> s;
  auto add_int = [&](const char* env, const char* flag, int64_t def, double scale, double lo,
                     double hi, const char* help, std::function<void(Config&, int64_t)> set) {
    KeySpec k{{env, flag, "int", std::to_string(def), help, scale, {}}, lo, hi, nullptr};
    k.apply = [set, k](Config& c, const std::string& v) {
      set(c, static_cast<int64_t>(parse_number(k, v, true)));
    };
    s.push_back(k);
  };
  auto add_float = [&](const char* env, const char* flag, const char* def, double lo, double hi,
                       const char* help, std::function<void(Config&, double)> set) {
    KeySpec k{{env, flag, "float", def, help, 1.0, {}}, lo, hi, nullptr};
    k.apply = [set, k](Config& c, const std::string& v) { set(c, parse_number(k, v, false)); };
    s.push_back(k);
  };
  auto add_choice = [&](const char* env, const char* flag, const char* def,
                        std::vector<std::string> choices, const char* help,
                        std::function<void(Config&, const std::string&)> set) {
    KeySpec k{{env, flag, "choice", def, help, 1.0, choices}, 0, 0, nullptr};
    // Choices are lower case and matched in any case (HOROVOD_LOG_LEVEL and
    // horovodrun's --log-level are upper case).
    k.apply = [set, k](Config& c, const std::string& v) {
      for (const auto& ch : k.key.choices)
        if (ch == lower(v)) return set(c, ch);
      reject(k.key, v, "not one of the choices");
    };
    s.push_back(k);
  };

  add_int("GRADFLOW_FUSION_THRESHOLD", "--fusion-threshold-mb", 64ll << 20, 1048576.0, 0, 1e12,
          "bytes per fused collective, 0 disables fusion (flag in MiB); integer >= 0",
          [](Config& c, int64_t v) { c.fusion_threshold_bytes = v; });
  // Pool buckets are smaller than fused collectives: a bucket is reduced as
  // soon as its gradients are ready, so smaller buckets start communication
  // earlier in backward, as DDP's 25 MB buckets do; the fusion buffer only
  // gathers what is already queued. Measured on the 25 M-parameter MLP at
  // 1 Gbit/s, 2 ranks, dense fp32: 64 MiB 54.8-55.1 samples/s, 8 MiB
  // 55.9-61.7 (docs/performance.md, "Pool bucket size").
  add_int("GRADFLOW_POOL_BUCKET_BYTES", "--pool-bucket-mb", 8ll << 20, 1048576.0, 4096, 1e12,
          "bytes per gradient-pool bucket (flag in MiB); at least 4096 bytes",
          [](Config& c, int64_t v) { c.pool_bucket_bytes = v; });
  // Off by default until measured on an idle machine (docs/performance.md,
  // issue 16 target 3): a model smaller than one bucket reduces nothing
  // during backward; DDP caps its first bucket at 1 MiB for that reason.
  add_int("GRADFLOW_POOL_FIRST_BUCKET_BYTES", "--pool-first-bucket-mb", 0, 1048576.0, 0, 1e12,
          "cap on the first gradient-pool bucket (the last layers), 0 = no cap (flag in MiB); "
          "integer >= 0",
          [](Config& c, int64_t v) { c.pool_first_bucket_bytes = v; });
  // An int 0..1 rather than a "bool" key: the launcher's bool flags only
  // switch on, and this one is on by default.
  add_int("GRADFLOW_POOL_MERGE", "--pool-merge", 1, 1.0, 0, 1,
          "1 | 0: adjacent pool buckets ready in the same cycle go out as one collective",
          [](Config& c, int64_t v) { c.pool_merge = v != 0; });
  add_float("GRADFLOW_CYCLE_TIME", "--cycle-time-ms", "1.0", 0.0, 10000.0,
            "sleep in ms of a coordination loop after a cycle with nothing to do, and its "
            "longest wait for this rank's next submit after a cycle with work (a submit wakes "
            "it; GRADFLOW_IDLE_CYCLE_MAX lengthens it while idle); 0 <= value <= 10000",
            [](Config& c, double v) { c.cycle_time_ms = v; });
  add_float("GRADFLOW_IDLE_CYCLE_MAX", "--idle-cycle-max-ms", "20.0", 0.0, 10000.0,
            "longest sleep in ms of a loop idle for several cycles: each idle cycle doubles the "
            "sleep from GRADFLOW_CYCLE_TIME up to this (a submit still wakes it at once); "
            "<= the cycle time = no backoff; 0 <= value <= 10000",
            [](Config& c, double v) { c.idle_cycle_max_ms = v; });
  add_int("GRADFLOW_CACHE_CAPACITY", "--cache-capacity", 1024, 1.0, 0, 1 << 20,
          "responses kept for the bit-vector fast path, 0 disables it; 0 <= value <= 1048576",
          [](Config& c, int64_t v) { c.cache_capacity = v; });
  add_float("GRADFLOW_TIMEOUT", "--timeout-seconds", "60", 0.1, 86400.0,
            "seconds a rank waits for a peer before raising; 0.1 <= value <= 86400",
            [](Config& c, double v) { c.timeout_seconds = v; });
  // Longer than GRADFLOW_TIMEOUT by default: it covers the ranks' start-up
  // skew (imports on a shared file system, containers starting apart),
  // which MPI_Init used to absorb without bound (init_watchdog.h).
  add_float("GRADFLOW_INIT_TIMEOUT", "--init-timeout-seconds", "300", 0.1, 86400.0,
            "seconds init() waits for MPI to start on every rank (MPI_Init, when nothing "
            "started MPI before init()); then the waiting ranks print why and exit with code 1; "
            "0.1 <= value <= 86400",
            [](Config& c, double v) { c.init_timeout_seconds = v; });
  add_float("GRADFLOW_STALL_CHECK_TIME", "--stall-check-time-seconds", "60", 0.0, 86400.0,
            "seconds before rank 0 warns about tensors not submitted by every rank, 0 = off",
            [](Config& c, double v) { c.stall_check_seconds = v; });
  add_float("GRADFLOW_STALL_SHUTDOWN_TIME", "--stall-shutdown-time-seconds", "0", 0.0, 86400.0,
            "seconds after which stalled tensors fail on every rank, 0 = off",
            [](Config& c, double v) { c.stall_shutdown_seconds = v; });
  add_choice("GRADFLOW_WIRE_DTYPE", "--wire-dtype", "fp32", {"fp32", "fp16", "bf16"},
             "fp32 | fp16 | bf16: how float32 gradients travel (16-bit summed in fp32)",
             [](Config& c, const std::string& v) { c.wire_dtype = parse_wire_dtype(v); });
  add_choice("GRADFLOW_ALLREDUCE_ALGO", "--allreduce-algo", "ring",
             {"ring", "two-sync", "mpi", "recursive-doubling", "halving-doubling", "auto"},
             "ring | two-sync | mpi | recursive-doubling | halving-doubling | auto",
             [](Config& c, const std::string& v) { c.allreduce_algo = parse_allreduce_algo(v); });
  add_int("GRADFLOW_RING_PIPELINE_BYTES", "--ring-pipeline-kb", 1 << 20, 1024.0, 1024, 1ll << 30,
          "bytes per pipelined ring piece (flag in KiB); 1024 <= value <= 2^30",
          [](Config& c, int64_t v) { c.ring_pipeline_bytes = v; });
  add_int("GRADFLOW_SPARSE_CHUNK", "--sparse-chunk", 32768, 1.0, 1, 1ll << 30,
          "elements per sparse-communication chunk; 1 <= value <= 2^30",
          [](Config& c, int64_t v) { c.sparse_chunk = v; });
  add_float("GRADFLOW_SPARSE_RATIO", "--sparse-ratio", "1.0", 1e-6, 1.0,
            "fraction of chunks sent per step, 1 = dense; 1e-6 <= value <= 1",
            [](Config& c, double v) { c.sparse_ratio = v; });
  add_int("GRADFLOW_SPARSE_WARMUP_STEPS", "--sparse-warmup-steps", 0, 1.0, 0, 1e12,
          "dense steps before sparse communication starts; integer >= 0",
          [](Config& c, int64_t v) { c.sparse_warmup_steps = v; });
  add_float("GRADFLOW_SPARSE_MOMENTUM", "--sparse-momentum", "0", 0.0, 0.999999,
            "momentum correction factor for sparse communication, 0 = off; 0 <= value < 1",
            [](Config& c, double v) { c.sparse_momentum = v; });
  // Default auto: a technique must never make a model slower (issue 16
  // target 3); auto only sends a bucket dense when its measured costs say
  // CSC does not pay there (Note [Auto sparse policy], sparse_auto_policy.cc).
  add_choice("GRADFLOW_SPARSE_POLICY", "--sparse-policy", "auto", {"auto", "always"},
             "auto | always: with sparse_ratio < 1, auto sends a bucket dense (its residual "
             "with it) when CSC's measured CPU cost exceeds the transfer time it saves; always "
             "sends the chosen chunks only",
             [](Config& c, const std::string& v) { c.sparse_policy_auto = v == "auto"; });
  {
    // Test/diagnostic input: fixed per-rank costs replace the measurements.
    // Step i of a bucket uses pair i mod (number of pairs); ranks may differ.
    KeySpec k{{"GRADFLOW_SPARSE_AUTO_COSTS", "--sparse-auto-costs", "string", "",
               "SPARSE_MS,DENSE_MS[;SPARSE_MS,DENSE_MS...]: fixed per-rank costs in ms (> 0), "
               "used in turn per bucket step, that replace the auto policy's measurements "
               "(tests, diagnosis); empty = measure",
               1.0, {}},
              0, 0, nullptr};
    k.apply = [k](Config& c, const std::string& v) {
      c.sparse_auto_costs.clear();
      if (v.empty()) return;
      size_t start = 0;
      while (start <= v.size()) {
        size_t semi = v.find(';', start);
        if (semi == std::string::npos) semi = v.size();
        const std::string pair = v.substr(start, semi - start);
        const size_t comma = pair.find(',');
        if (comma == std::string::npos)
          reject(k.key, v, "expected pairs 'SPARSE_MS,DENSE_MS' separated by ';'");
        double ms[2];
        const std::string parts[2] = {pair.substr(0, comma), pair.substr(comma + 1)};
        for (int i = 0; i < 2; ++i) {
          char* end = nullptr;
          ms[i] = std::strtod(parts[i].c_str(), &end);
          if (parts[i].empty() || *end != '\0' || !std::isfinite(ms[i]) || ms[i] <= 0)
            reject(k.key, v, "each cost must be a number > 0");
        }
        c.sparse_auto_costs.emplace_back(ms[0] / 1000.0, ms[1] / 1000.0);
        start = semi + 1;
      }
    };
    s.push_back(k);
  }
  auto add_bool = [&](const char* env, const char* flag, bool def, const char* help,
                      std::function<void(Config&, bool)> set) {
    KeySpec k{{env, flag, "bool", def ? "1" : "0", help, 1.0, {}}, 0, 0, nullptr};
    k.apply = [set, k](Config& c, const std::string& v) {
      const std::string l = lower(v);
      if (l == "1" || l == "true" || l == "yes" || l == "on") return set(c, true);
      if (l == "0" || l == "false" || l == "no" || l == "off") return set(c, false);
      reject(k.key, v, "not a boolean");
    };
    s.push_back(k);
  };
  KeySpec timeline{{"GRADFLOW_TIMELINE", "--timeline-filename", "string", "",
                    "path of a Chrome-trace JSON file written by rank 0; empty = off", 1.0, {}},
                   0, 0, [](Config& c, const std::string& v) { c.timeline = v; }};
  s.push_back(timeline);
  add_bool("GRADFLOW_TIMELINE_MARK_CYCLES", "--timeline-mark-cycles", false,
           "1 | 0: an instant event on the timeline's cycles row for each coordination cycle "
           "that runs collectives",
           [](Config& c, bool v) { c.timeline_mark_cycles = v; });
  add_choice("GRADFLOW_LOG_LEVEL", "--log-level", "warning",
             {"trace", "debug", "info", "warning", "error", "fatal"},
             "trace | debug | info | warning | error | fatal (any case); debug logs each "
             "cycle that runs collectives, trace each response",
             [](Config& c, const std::string& v) { c.log_level = v; });
  // Horovod's autotune flags, same names and defaults (horovodrun
  // --autotune-warmup-samples 3, --autotune-steps-per-sample 10).
  add_bool("GRADFLOW_AUTOTUNE", "--autotune", false,
           "1 | 0: tune algorithm, pool bucket size, ring piece size and cycle time from "
           "measured step times during the first steps (DistributedOptimizer)",
           [](Config& c, bool v) { c.autotune = v; });
  KeySpec autotune_log{{"GRADFLOW_AUTOTUNE_LOG", "--autotune-log-file", "string", "",
                        "CSV file rank 0 writes the autotune samples and final choice to; "
                        "empty = none", 1.0, {}},
                       0, 0, [](Config& c, const std::string& v) { c.autotune_log = v; }};
  s.push_back(autotune_log);
  add_int("GRADFLOW_AUTOTUNE_WARMUP_SAMPLES", "--autotune-warmup-samples", 3, 1.0, 0, 1000,
          "autotune samples discarded before the search starts; 0 <= value <= 1000",
          [](Config& c, int64_t v) { c.autotune_warmup_samples = v; });
  add_int("GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE", "--autotune-steps-per-sample", 10, 1.0, 1, 1000,
          "training steps timed per autotune sample; 1 <= value <= 1000",
          [](Config& c, int64_t v) { c.autotune_steps_per_sample = v; });
  return s;
}

const std::vector<KeySpec>& specs() {
  static const std::vector<KeySpec> s = make_specs();
  return s;
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> k;
    for (const auto& s : specs()) k.push_back(s.key);
    return k;
  }();
  return keys;
}

Config load_config(const std::map<std::string, std::string>& overrides) {
  Config c;
  for (const auto& s : specs()) {
    auto it = overrides.find(s.key.env);
    if (it != overrides.end()) {
      s.apply(c, it->second);
    } else if (const char* v = std::getenv(s.key.env.c_str())) {
      if (*v != '\0') s.apply(c, v);
    }
  }
  for (const auto& kv : overrides) {
    bool known = false;
    for (const auto& s : specs()) known = known || s.key.env == kv.first;
    GF_CHECK(known, "gradflow: unknown setting '" << kv.first << "'");
  }
  return c;
}

WireDtype parse_wire_dtype(const std::string& s) {
  if (s == "fp32" || s == "none" || s == "native") return WireDtype::kNative;
  if (s == "fp16") return WireDtype::kFloat16;
  if (s == "bf16") return WireDtype::kBFloat16;
  throw GradflowError("gradflow: unknown wire dtype '" + s + "' (fp32 | fp16 | bf16)");
}

AllreduceAlgo parse_allreduce_algo(const std::string& s) {
  if (s == "ring") return AllreduceAlgo::kRing;
  if (s == "two-sync") return AllreduceAlgo::kTwoSync;
  if (s == "mpi") return AllreduceAlgo::kMpi;
  if (s == "recursive-doubling") return AllreduceAlgo::kRecursiveDoubling;
  if (s == "halving-doubling") return AllreduceAlgo::kHalvingDoubling;
  if (s == "auto") return AllreduceAlgo::kAuto;
  throw GradflowError("gradflow: unknown allreduce algorithm '" + s +
                      "' (ring | two-sync | mpi | recursive-doubling | halving-doubling | auto)");
}

}  // namespace gradflow
