// config_check.cc — init()'s check that every rank runs with the same
// protocol-relevant GRADFLOW_* settings, and its error: which setting
// differs on which ranks, or which rank's values did not parse.
#include "config_check.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "common.h"

namespace gradflow {

namespace {

// "NAME=value;" fields -> (NAME, value) pairs, in order.
std::vector<std::pair<std::string, std::string>> config_fields(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t from = 0;
  for (size_t semi; (semi = s.find(';', from)) != std::string::npos; from = semi + 1) {
    std::string field = s.substr(from, semi - from);
    size_t eq = field.find('=');
    out.emplace_back(field.substr(0, eq), eq == std::string::npos ? "" : field.substr(eq + 1));
  }
  return out;
}

// Rank 0's account of which settings differ, from every rank's fields:
// "GRADFLOW_WIRE_DTYPE: 1 on rank 0, 2; 0 on rank 1" (values as the core
// holds them: bytes, enum codes, 1/0).
constexpr const char* kInvalid = "INVALID";

std::string config_difference(const std::vector<std::vector<uint8_t>>& all) {
  std::vector<std::vector<std::pair<std::string, std::string>>> parsed;
  for (const auto& bytes : all) parsed.push_back(config_fields(std::string(bytes.begin(), bytes.end())));
  std::ostringstream why;
  std::vector<size_t> valid;  // ranks whose values parsed
  for (size_t r = 0; r < parsed.size(); ++r) {
    if (!parsed[r].empty() && parsed[r][0].first == kInvalid)
      why << "; rank " << r << ": " << parsed[r][0].second;
    else
      valid.push_back(r);
  }
  if (valid.empty()) return why.str();
  const auto& ref = parsed[valid[0]];
  for (size_t f = 0; f < ref.size(); ++f) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // value -> ranks
    for (size_t r : valid) {
      const std::string v = f < parsed[r].size() ? parsed[r][f].second : "?";
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
      if (it == groups.end()) groups.push_back({v, {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    why << "; " << ref[f].first << ":";
    for (size_t g = 0; g < groups.size(); ++g) {
      why << (g ? ";" : "") << " " << groups[g].first << " on rank";
      const auto& ranks = groups[g].second;
      if (ranks.size() > 1) why << "s";
      for (size_t i = 0; i < ranks.size() && i < 8; ++i) why << (i ? ", " : " ") << ranks[i];
      if (ranks.size() > 8) why << ", ... (" << ranks.size() << " ranks)";
    }
  }
  return why.str();
}

}  // namespace

void check_config_matches_everywhere(MpiComm& comm, const Config& cfg,
                                      const std::string& config_error) {
  // Settings that change what ranks send (fusion, cache size, wire, ...) must
  // agree or ranks would disagree on the protocol: compare a hash.
  // One "NAME=value;" field per setting at full precision, so different
  // settings can never print the same (e.g. "1000"+"50" vs "10005"+"0").
  std::ostringstream fields;
  fields.precision(17);
  if (!config_error.empty()) {
    std::string text = config_error;  // one field: no separators inside
    std::replace(text.begin(), text.end(), ';', ',');
    fields << kInvalid << "=" << text << ";";
  } else {
    fields << "GRADFLOW_FUSION_THRESHOLD=" << cfg.fusion_threshold_bytes
           << ";GRADFLOW_POOL_BUCKET_BYTES=" << cfg.pool_bucket_bytes
           << ";GRADFLOW_POOL_MERGE=" << cfg.pool_merge
           << ";GRADFLOW_POOL_FIRST_BUCKET_BYTES=" << cfg.pool_first_bucket_bytes
           << ";GRADFLOW_CACHE_CAPACITY=" << cfg.cache_capacity
           << ";GRADFLOW_SPARSE_RATIO=" << cfg.sparse_ratio
           << ";GRADFLOW_WIRE_DTYPE=" << static_cast<int>(cfg.wire_dtype)
           << ";GRADFLOW_ALLREDUCE_ALGO=" << static_cast<int>(cfg.allreduce_algo)
           << ";GRADFLOW_SPARSE_CHUNK=" << cfg.sparse_chunk
           << ";GRADFLOW_SPARSE_WARMUP_STEPS=" << cfg.sparse_warmup_steps
           << ";GRADFLOW_RING_PIPELINE_BYTES=" << cfg.ring_pipeline_bytes
           << ";GRADFLOW_SPARSE_MOMENTUM=" << cfg.sparse_momentum
           << ";GRADFLOW_CYCLE_TIME=" << cfg.cycle_time_ms
           << ";GRADFLOW_IDLE_CYCLE_MAX=" << cfg.idle_cycle_max_ms
           << ";GRADFLOW_SPARSE_POLICY=" << cfg.sparse_policy_auto
           << ";GRADFLOW_AUTOTUNE=" << cfg.autotune
           << ";GRADFLOW_AUTOTUNE_WARMUP_SAMPLES=" << cfg.autotune_warmup_samples
           << ";GRADFLOW_AUTOTUNE_STEPS_PER_SAMPLE=" << cfg.autotune_steps_per_sample << ";";
  }
  const std::string s = fields.str();
  uint64_t h = std::hash<std::string>()(s);
  uint64_t words[2] = {h, ~h};
  comm.allreduce_band(words, 2, "init (configuration check)");
  if (words[0] == h && words[1] == ~h) {
    if (!config_error.empty()) throw GradflowError(config_error);  // the same on every rank
    return;
  }
  // Every rank saw the difference: rank 0 names the settings and the ranks
  // from everyone's fields, and every rank raises the same text.
  std::vector<uint8_t> text;
  auto all = comm.gather_to_root(std::vector<uint8_t>(s.begin(), s.end()), 0,
                                   "init (configuration check)");
  if (comm.rank() == 0) {
    const std::string diff = config_difference(all);
    const bool invalid = diff.rfind("; rank ", 0) == 0;  // invalid ranks come first
    std::string why = std::string(invalid ? "gradflow: GRADFLOW_* settings are invalid on some "
                                            "ranks"
                                          : "gradflow: GRADFLOW_* settings differ between ranks") +
                      diff +
                      (invalid ? "" : " (values as the core holds them: bytes, choice codes, "
                                      "1/0)") +
                      ". Every rank must use the same, valid settings: set them in the "
                      "launcher's environment (gradflowrun flags or -x/-genv), not per rank";
    text.assign(why.begin(), why.end());
  }
  comm.bcast_vector(text, 0, "init (configuration check)");
  throw GradflowError(std::string(text.begin(), text.end()));
}

}  // namespace gradflow
