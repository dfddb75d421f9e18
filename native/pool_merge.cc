// pool_merge.cc — planning of merged pool-bucket collectives (pool_merge.h).
#include "pool_merge.h"

#include <cstdlib>

namespace gradflow {
namespace {

// A whole non-negative decimal number from s[at, end) (no sign, no spaces).
bool parse_index(const std::string& s, size_t at, size_t end, long* out) {
  if (at >= end || end - at > 9) return false;
  long v = 0;
  for (size_t i = at; i < end; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

bool mergeable(const Response& r) {
  return r.kind == OpKind::kAllreduce && r.in_pool && r.error.empty() && r.sparse_ratio >= 1.0 &&
         r.op != ReduceOp::kAdasum;
}

}  // namespace

bool parse_pool_bucket_name(const std::string& name, long* pool, long* cut, long* bucket) {
  static const std::string head = "gradflow.pool", cut_mid = ".cut", mid = ".bucket";
  if (name.compare(0, head.size(), head) != 0) return false;
  size_t dot = name.find(mid, head.size());
  if (dot == std::string::npos) return false;
  // An autotune re-cut names its buckets "...pool<P>.cut<K>.bucket<B>"
  // (GradPool::bucket_name); cut 0 has no ".cut" part.
  size_t pool_end = dot;
  *cut = 0;
  size_t c = name.find(cut_mid, head.size());
  if (c != std::string::npos && c < dot) {
    if (!parse_index(name, c + cut_mid.size(), dot, cut)) return false;
    pool_end = c;
  }
  return parse_index(name, head.size(), pool_end, pool) &&
         parse_index(name, dot + mid.size(), name.size(), bucket);
}

std::vector<size_t> merge_adjacent_pool_buckets(const std::vector<Response>& responses,
                                                const std::vector<size_t>& groups) {
  std::vector<size_t> out;
  size_t at = 0;
  long run_pool = -1, run_cut = -1, run_last = -1;  // the open run: its pool, cut, last bucket
  const Response* run_first = nullptr;
  for (size_t g : groups) {
    const Response& r = responses[at];
    at += g;
    long pool = -1, cut = -1, bucket = -1;
    bool candidate =
        g == 1 && mergeable(r) && parse_pool_bucket_name(r.name, &pool, &cut, &bucket);
    if (candidate && run_first && pool == run_pool && cut == run_cut && bucket == run_last + 1 &&
        r.dtype == run_first->dtype && r.op == run_first->op && r.wire == run_first->wire &&
        r.prescale == run_first->prescale && r.postscale == run_first->postscale) {
      out.back() += 1;
      run_last = bucket;
      continue;
    }
    out.push_back(g);
    run_first = candidate ? &r : nullptr;
    run_pool = pool;
    run_cut = cut;
    run_last = bucket;
  }
  return out;
}

}  // namespace gradflow
