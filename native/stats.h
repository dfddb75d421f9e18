// stats.h — named counters (bytes on the wire, collectives run, seconds in
// negotiation / codec / transfer / waiting, fusion copies), keyed by
// "<metric>" or "<metric>.<algorithm>.<wire>". Thread-safe; read by
// gradflow.stats(). Cheap enough to update once per collective, never per element.
#pragma once

#include <map>
#include <mutex>
#include <string>

namespace gradflow {

class Stats {
 public:
  void add(const std::string& key, double value) {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] += value;
  }
  std::map<std::string, double> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return values_;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    values_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, double> values_;
};

}  // namespace gradflow
