// coordinator.cc — readiness agreement (see the protocol in coordinator.h):
// bit-vector fast path, rank-0 slow path (the per-name check is
// request_validation.cc), stall inspection.
#include "coordinator.h"
#include "log.h"
#include "request_validation.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace gradflow {
namespace {

constexpr uint64_t kFlagSlow = 1;      // some rank has slow-path work
constexpr uint64_t kFlagShutdown = 2;  // some rank called shutdown()
constexpr uint64_t kFlagAbort = 4;     // some rank is failing
// Stored as is (not inverted), so BAND gives "every rank is blocked in wait()".
constexpr uint64_t kFlagBlocked = 8;
// A member of this process set has a global join() pending (OR across
// ranks): Note [Join and process sets].
constexpr uint64_t kFlagJoined = 16;
// As kFlagBlocked, stored as is: every rank waits on this engine itself
// (Note [Waits across engines]; on set engines the same as kFlagBlocked).
constexpr uint64_t kFlagBlockedHere = 32;
constexpr const char* kJoinName = kJoinTensorName;
// Note [Join and process sets]: how long a set's name waits on a joined
// member before it fails (fail_names_missing_on_joined says why).
constexpr double kJoinedGraceSeconds = 2.0;

// "submitted by ranks [ 0 2 ], missing on ranks [ 1 ]" for one pending name
// (a rank's entry is empty until it submitted): stall and deadlock messages.
std::string who_submitted(const std::vector<Request>& by_rank) {
  std::ostringstream have, missing;
  for (size_t r = 0; r < by_rank.size(); ++r) (by_rank[r].name.empty() ? missing : have) << r << " ";
  return "submitted by ranks [ " + have.str() + "], missing on ranks [ " + missing.str() + "]";
}

void set_bit(std::vector<uint64_t>& w, size_t base, int32_t bit) {
  w[base + bit / 64] |= (uint64_t{1} << (bit % 64));
}
void clear_bit(std::vector<uint64_t>& w, size_t base, int32_t bit) {
  w[base + bit / 64] &= ~(uint64_t{1} << (bit % 64));
}
bool test_bit(const std::vector<uint64_t>& w, size_t base, int32_t bit) {
  return (w[base + bit / 64] >> (bit % 64)) & 1;
}

}  // namespace

Coordinator::Coordinator(MpiComm& comm, const Config& cfg)
    : comm_(comm), cfg_(cfg), cache_words_((cfg.cache_capacity + 63) / 64) {}

CycleResult Coordinator::cycle(const std::vector<Request>& fresh, bool shutdown,
                               const std::string& abort_message, bool blocked,
                               bool blocked_here) {
  auto t0 = std::chrono::steady_clock::now();
  CycleResult result;
  const uint64_t evictions_before = evictions_;
  std::vector<Request> slow;
  std::vector<int32_t> invalid;

  // A. classify new requests (after those whose cache bit was recycled).
  slow.swap(slow_next_cycle_);
  for (const Request& r : fresh)
    if (r.kind == OpKind::kJoin) joined_ = true;
  if (owns_links_) links_->global_join.store(joined_);
  for (const Request& r : fresh) {
    auto it = cache_bit_of_.find(r.name);
    if (it != cache_bit_of_.end() && r.kind != OpKind::kJoin) {
      if (cache_[it->second].signature == r.signature()) {
        waiting_on_cache_[r.name] = r;
        cache_wait_since_[r.name] = t0;
        continue;
      }
      invalid.push_back(it->second);
    }
    slow.push_back(r);
  }
  // A rank stuck on the fast path demotes its request to the slow path so
  // rank 0's stall inspector can see (and name) the ranks that are missing.
  double demote_after = cfg_.stall_check_seconds > 0 ? cfg_.stall_check_seconds / 2 : 5.0;
  if (cfg_.stall_shutdown_seconds > 0)
    demote_after = std::min(demote_after, cfg_.stall_shutdown_seconds / 2);
  // Note [Bounded waits]: every rank blocked for half the timeout: let rank 0 see all.
  // (Note [Waits across engines]: the same for the whole job's spell.)
  const double blocked_for = all_blocked_ ? seconds_since(all_blocked_since_) : 0.0;
  const double job_blocked_for = job_blocked_ ? seconds_since(job_blocked_since_) : 0.0;
  if (all_blocked_ && blocked_for > cfg_.timeout_seconds / 2) demote_after = 0.0;
  if (job_blocked_ && job_blocked_for > cfg_.timeout_seconds / 2) demote_after = 0.0;
  // Note [Join and process sets]: a cached name cannot complete either.
  if (member_joined_) demote_after = 0.0;
  for (auto it = waiting_on_cache_.begin(); it != waiting_on_cache_.end();) {
    if (seconds_since(cache_wait_since_[it->first]) > demote_after) {
      invalid.push_back(cache_bit_of_.at(it->first));
      slow.push_back(it->second);
      cache_wait_since_.erase(it->first);
      it = waiting_on_cache_.erase(it);
    } else {
      ++it;
    }
  }

  // B. one allreduce(BAND) of flags, ready bits and invalid bits.
  // Note [Bounded waits] when every rank waits here; Note [Waits across
  // engines] (global engine only) when, for longer, the whole job waits.
  const bool deadlock = all_blocked_ && blocked_for > cfg_.timeout_seconds;
  const bool job_deadlock = owns_links_ && job_blocked_ && !all_blocked_ &&
                            job_blocked_for > 1.5 * cfg_.timeout_seconds;
  bool rank0_due = comm_.rank() == 0 && (stall_action_due() || deadlock || job_deadlock);
  const bool i_joined = links_ && !owns_links_ && links_->global_join.load();
  uint64_t flags = (slow.empty() && invalid.empty() && !rank0_due ? 0 : kFlagSlow) |
                   (shutdown ? kFlagShutdown : 0) | (abort_message.empty() ? 0 : kFlagAbort) |
                   (i_joined ? kFlagJoined : 0);
  const size_t ready_base = 1, invalid_base = 1 + cache_words_;
  std::vector<uint64_t> words(1 + 2 * cache_words_, 0);
  words[0] = ~flags;
  for (size_t i = 0; i < cache_words_; ++i) words[invalid_base + i] = ~uint64_t{0};
  for (const auto& kv : waiting_on_cache_) set_bit(words, ready_base, cache_bit_of_.at(kv.first));
  if (joined_) {
    // A joined rank contributes zeros to every cached allreduce: mark them all.
    for (const auto& kv : cache_)
      if (kv.second.response.kind == OpKind::kAllreduce) set_bit(words, ready_base, kv.first);
  }
  for (int32_t b : invalid) clear_bit(words, invalid_base, b);
  words[0] = blocked ? (words[0] | kFlagBlocked) : (words[0] & ~kFlagBlocked);
  words[0] = blocked_here ? (words[0] | kFlagBlockedHere) : (words[0] & ~kFlagBlockedHere);
  comm_.allreduce_band(words.data(), words.size(), "negotiation (bit vector)");
  const bool job_blocked = (words[0] & kFlagBlocked) != 0;
  const bool all_blocked = (words[0] & kFlagBlockedHere) != 0;
  flags = ~words[0] & ~(kFlagBlocked | kFlagBlockedHere);
  member_joined_ = (flags & kFlagJoined) != 0;

  // C. evict invalid responses everywhere, then take the globally ready ones.
  std::vector<int32_t> bits;
  for (const auto& kv : cache_) bits.push_back(kv.first);
  for (int32_t b : bits)
    if (!test_bit(words, invalid_base, b)) evict_bit(b, &slow);
  for (auto& kv : cache_) {
    if (!test_bit(words, ready_base, kv.first)) continue;
    kv.second.last_used = ++use_clock_;
    result.responses.push_back(kv.second.response);
    waiting_on_cache_.erase(kv.second.response.name);
    cache_wait_since_.erase(kv.second.response.name);
  }

  result.fast_responses = result.responses.size();

  // D. slow path through rank 0.
  if (flags & (kFlagSlow | kFlagShutdown | kFlagAbort | kFlagJoined)) {
    result.used_slow_path = true;
    RequestMessage mine;
    mine.requests = slow;
    mine.shutdown = shutdown;
    mine.abort_message = abort_message;
    mine.joined = i_joined;
    for (const Request& r : slow) sent_to_rank0_[r.name] = r;
    auto gathered = comm_.gather_to_root(serialize(mine), 0, "negotiation (requests to rank 0)");
    ResponseMessage decided;
    if (comm_.rank() == 0) {
      std::vector<RequestMessage> all;
      for (const auto& bytes : gathered) all.push_back(deserialize_requests(bytes));
      // Listed before build_slow_responses takes completed names out.
      const std::string job_abort = job_deadlock ? job_deadlock_message(job_blocked_for) : "";
      build_slow_responses(all, &decided, deadlock);
      if (member_joined_) fail_names_missing_on_joined(all, &decided);
      // Only if this very cycle still finds the whole job waiting and agrees
      // nothing: a name completed now is movement, not a deadlock.
      if (!job_abort.empty() && job_blocked && result.responses.empty() &&
          decided.responses.empty() && decided.abort_message.empty())
        decided.abort_message = job_abort;
    }
    std::vector<uint8_t> bytes = serialize(decided);
    comm_.bcast_vector(bytes, 0, "negotiation (responses from rank 0)");
    decided = deserialize_responses(bytes);
    for (Response& r : decided.responses) {
      auto it = sent_to_rank0_.find(r.name);
      // A bit rank 0 recycled: its previous owner leaves the cache on every
      // rank (Note [Execution order]); requests waiting on it go slow.
      if (r.cache_bit >= 0) evict_bit(r.cache_bit, &slow_next_cycle_);
      if (r.cache_bit >= 0 && it != sent_to_rank0_.end()) insert_cache(r, it->second.signature());
      if (r.cache_bit >= 0 && it == sent_to_rank0_.end() && joined_) insert_cache(r, "");
      if (it != sent_to_rank0_.end()) sent_to_rank0_.erase(it);
      if (r.kind == OpKind::kJoin) joined_ = false;
      result.responses.push_back(std::move(r));
    }
    result.shutdown = decided.shutdown;
    result.shutdown_ranks = decided.shutdown_ranks;
    result.abort_message = decided.abort_message;
    if (owns_links_) links_->global_join.store(joined_);
  }
  // Note [Bounded waits]: the same flags and responses on every rank, so
  // every rank's clock starts and stops at the same cycle.
  if (!all_blocked || !result.responses.empty()) {
    all_blocked_ = false;
  } else if (!all_blocked_) {
    all_blocked_ = true;
    all_blocked_since_ = std::chrono::steady_clock::now();
  }
  // Note [Waits across engines]: the whole job's spell (global engine; the
  // flag also drops whenever any engine moved or any wait began).
  if (!job_blocked || !result.responses.empty()) {
    job_blocked_ = false;
  } else if (!job_blocked_) {
    job_blocked_ = true;
    job_blocked_since_ = std::chrono::steady_clock::now();
  }
  result.cache_evictions = evictions_ - evictions_before;
  result.negotiation_seconds = seconds_since(t0);
  return result;
}

void Coordinator::insert_cache(const Response& r, const std::string& signature) {
  cache_bit_of_[r.name] = r.cache_bit;
  cache_[r.cache_bit] = CacheEntry{r, signature, ++use_clock_};
}

void Coordinator::evict_bit(int32_t bit, std::vector<Request>* slow) {
  auto c = cache_.find(bit);
  if (c == cache_.end()) return;
  const std::string name = c->second.response.name;
  auto w = waiting_on_cache_.find(name);
  if (w != waiting_on_cache_.end()) {
    slow->push_back(w->second);
    waiting_on_cache_.erase(w);
    cache_wait_since_.erase(name);
  }
  cache_bit_of_.erase(name);
  cache_.erase(c);
  evictions_++;
}

int32_t Coordinator::pick_bit(const std::set<int32_t>& taken) const {
  // The lowest free bit, else the least recently used one not handed out in
  // this round. Only rank 0 picks; the response carries the choice.
  for (int32_t b = 0; b < cfg_.cache_capacity; ++b)
    if (!cache_.count(b) && !taken.count(b)) return b;
  int32_t lru = -1;
  uint64_t oldest = 0;
  for (const auto& kv : cache_)
    if (!taken.count(kv.first) && (lru < 0 || kv.second.last_used < oldest))
      lru = kv.first, oldest = kv.second.last_used;
  return lru;
}

void Coordinator::build_slow_responses(const std::vector<RequestMessage>& all,
                                       ResponseMessage* out, bool deadlock) {
  const int n = comm_.size();
  for (int rank = 0; rank < static_cast<int>(all.size()); ++rank) {
    const RequestMessage& msg = all[rank];
    out->shutdown = out->shutdown || msg.shutdown;
    if (msg.shutdown) out->shutdown_ranks.push_back(rank);
    if (!msg.abort_message.empty() && out->abort_message.empty())
      out->abort_message = "rank " + std::to_string(rank) + " failed: " + msg.abort_message;
    for (const Request& req : msg.requests) {
      if (req.kind == OpKind::kJoin) {
        joined_ranks_.insert(rank);
        last_joined_rank_ = rank;  // requests arrive in the order ranks joined
      }
      const std::string& key = req.kind == OpKind::kJoin ? std::string(kJoinName) : req.name;
      auto it = table_.find(key);
      if (it == table_.end()) {
        PendingOnRank0 p;
        p.by_rank.resize(n);
        p.first_seen = std::chrono::steady_clock::now();
        it = table_.emplace(key, std::move(p)).first;
        table_order_.push_back(key);
      }
      if (it->second.by_rank[rank].name.empty()) it->second.count++;
      it->second.by_rank[rank] = req;
    }
  }
  // A name is complete once every rank asked for it (joined ranks count as
  // having asked for any allreduce).
  std::set<int32_t> taken;  // cache bits handed out in this round
  for (auto it = table_order_.begin(); it != table_order_.end();) {
    PendingOnRank0& p = table_[*it];
    int joined_absent = 0;
    if (*it != kJoinName)
      for (int r : joined_ranks_) joined_absent += p.by_rank[r].name.empty() ? 1 : 0;
    if (p.count + joined_absent < n) {
      ++it;
      continue;
    }
    std::string abort_job;
    Response resp = validate(*it, p.by_rank, &abort_job);
    // Note [Step tags], Note [Grouped lists]: the ranks run different steps
    // or lists; nothing of them can complete on every rank, so the whole job
    // fails now.
    if (!abort_job.empty() && out->abort_message.empty()) out->abort_message = abort_job;
    if (resp.kind == OpKind::kJoin) joined_ranks_.clear();
    if (resp.error.empty() && resp.kind == OpKind::kAllreduce && cfg_.cache_capacity > 0 &&
        !cache_bit_of_.count(resp.name)) {
      resp.cache_bit = pick_bit(taken);
      if (resp.cache_bit >= 0) taken.insert(resp.cache_bit);
    }
    out->responses.push_back(std::move(resp));
    table_.erase(*it);
    it = table_order_.erase(it);
  }
  check_stalls(out, deadlock);
}

Response Coordinator::validate(const std::string& name, const std::vector<Request>& reqs,
                               std::string* abort_job) {
  return validate_requests(name, reqs, comm_.size(), last_joined_rank_, abort_job);
}

void Coordinator::fail_names_missing_on_joined(const std::vector<RequestMessage>& all,
                                               ResponseMessage* out) {
  std::vector<int> joined;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].joined) joined.push_back(static_cast<int>(r));
  for (auto it = table_order_.begin(); it != table_order_.end();) {
    const PendingOnRank0& p = table_[*it];
    int absent = -1;
    for (int r : joined)
      if (absent < 0 && p.by_rank[r].name.empty()) absent = r;
    // A member's join flag may still be up for a moment after its join
    // completed on another member, which already submits to the set (each
    // rank's global loop takes the join's response in its own time): only a
    // name that has waited kJoinedGrace is failed (seen in a full run: a
    // name submitted right after join() returned failed, naming a member
    // whose join had just completed too).
    if (absent >= 0 && seconds_since(p.first_seen) < kJoinedGraceSeconds) absent = -1;
    if (absent < 0) {
      ++it;
      continue;
    }
    Response r;
    r.name = *it;
    for (const Request& q : p.by_rank)
      if (!q.name.empty()) r.kind = q.kind;
    r.error = "gradflow: " + std::string(op_kind_name(r.kind)) + " '" + *it +
              "' cannot run: rank " + std::to_string(absent) +
              " has called join(), which covers the global process set only (a joined rank "
              "submits nothing to a process set; call join() after the last process-set "
              "collective)";
    out->responses.push_back(std::move(r));
    table_.erase(*it);
    it = table_order_.erase(it);
  }
}

bool Coordinator::stall_action_due() const {
  for (const auto& kv : table_) {
    double age = seconds_since(kv.second.first_seen);
    if (cfg_.stall_shutdown_seconds > 0 && age > cfg_.stall_shutdown_seconds) return true;
    if (cfg_.stall_check_seconds > 0 && age > cfg_.stall_check_seconds && !kv.second.warned)
      return true;
  }
  return false;
}

void Coordinator::check_stalls(ResponseMessage* out, bool deadlock) {
  for (auto it = table_order_.begin(); it != table_order_.end();) {
    PendingOnRank0& p = table_[*it];
    double age = seconds_since(p.first_seen);
    OpKind kind = OpKind::kAllreduce;  // of the first rank that submitted (rank 0 may not have)
    for (size_t r = p.by_rank.size(); r-- > 0;) {
      if (!p.by_rank[r].name.empty()) kind = p.by_rank[r].kind;
    }
    std::string msg = "gradflow stall: '" + *it + "' (" + op_kind_name(kind) +
                      ") has waited " + std::to_string(static_cast<int>(age)) + " s; " +
                      who_submitted(p.by_rank);
    if (cfg_.stall_check_seconds > 0 && age > cfg_.stall_check_seconds && !p.warned) {
      p.warned = true;
      stall_warnings_.push_back(msg);
      GF_LOG(kWarning, 0, msg << " (GRADFLOW_STALL_CHECK_TIME)");
    }
    const bool stalled = cfg_.stall_shutdown_seconds > 0 && age > cfg_.stall_shutdown_seconds;
    if (stalled || deadlock) {
      Response r;
      r.name = *it;
      r.kind = kind;
      r.error = msg + (stalled ? std::string("; failing it on every rank (GRADFLOW_STALL_SHUTDOWN_TIME)")
                               : "; every rank has waited " +
                                     std::to_string(static_cast<int>(cfg_.timeout_seconds)) +
                                     " s for collectives that no rank can complete (names that "
                                     "differ between ranks?): failing it on every rank "
                                     "(GRADFLOW_TIMEOUT)");
      out->responses.push_back(r);
      table_.erase(*it);
      it = table_order_.erase(it);
      continue;
    }
    ++it;
  }
}

std::string Coordinator::job_deadlock_message(double blocked_for) const {
  std::ostringstream m;
  m << "every rank has waited " << static_cast<int>(blocked_for)
    << " s in collectives that cannot complete, not all of them on the global process set "
       "(collectives of different process sets, or of a set and the global set, called in "
       "different orders on different ranks?). Nothing can move, so the job is aborted "
       "(after GRADFLOW_TIMEOUT x 1.5)";
  if (table_order_.empty()) {
    m << ". Nothing is pending on the global set; the waits are on process sets";
  } else {
    m << ". Pending on the global set:";
    for (const std::string& name : table_order_)
      m << " '" << name << "' " << who_submitted(table_.at(name).by_rank) << ";";
  }
  return m.str();
}

}  // namespace gradflow
