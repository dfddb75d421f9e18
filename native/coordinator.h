// coordinator.h — agreement on which collectives are ready on every rank,
// without touching tensor data. Runs on the background thread, once per
// cycle, collectively on all ranks.
//
// Protocol of one cycle (every rank, in lockstep):
//   A. Classify this rank's new requests: a name whose signature matches a
//      cached response sets that response's bit ("ready"); a cached name
//      with a different signature sets its "invalid" bit and goes to the
//      slow path; anything else goes to the slow path.
//   B. One allreduce(BAND) of [flags | ready bits | invalid bits] (flags and
//      invalid bits are stored inverted so BAND computes their OR).
//   C. Invalid bits evict their responses everywhere; a rank whose pending
//      request was waiting on an evicted bit moves it to the slow path.
//      Ready bits set on every rank become responses, in bit order.
//   D. Only if some rank has slow-path requests (or shutdown/abort): each
//      rank sends them to rank 0, which records which ranks asked for which
//      name, validates names complete on all ranks (kind, dtype, shape, op,
//      root, ... must match; a mismatch becomes an error response naming the
//      ranks and what differed; grouped ops' lists that differ in length
//      abort the job: Note [Grouped lists]), assigns cache bits, and
//      broadcasts the list.
//      A new bit is the lowest free one, else the least recently used: a
//      response's bit evicts the bit's previous owner on every rank, so bits
//      freed by evictions and demotions, and the bits of names used once
//      (auto-generated names), are recycled and the fast path never runs out.
//   E. Result: fast-path responses then slow-path responses.
//
// Bounded waits: see Note [Bounded waits] below (Coordinator's members).
//
// Note [Execution order]: every rank receives the same response list (the
// fast part is computed from the same allreduced bit vector, the slow part
// is rank 0's broadcast) and executes it front to back. Caches are updated
// only from that list, so bit assignments agree everywhere. That is what
// makes collectives issued in different orders on different ranks safe.
//
// Note [Step tags]: an allreduce may carry a tag naming the step it belongs
// to; the tag is part of the signature, and every rank must give the same.
// When rank 0 finds one name submitted under two tags, it aborts the job at
// once with both tags (CycleResult::abort_message): the other names of those
// steps can never match, so a per-name error would leave them waiting. The
// tag's first word says what it checks (step_tag_mismatch explains each):
// - "<k> of <n> gradients #<hash>" (TensorFlow): a traced step whose gradient
//   list differs per rank (a gradient None on some ranks only, fixed when
//   each rank traced its step) submits different names on different ranks;
//   before tags every rank stalled for GRADFLOW_TIMEOUT.
// - "hyperparameters #<crc> ..." (torch and Keras DistributedOptimizer,
//   every 16th step): a running CRC of the optimizer's learning rate,
//   momentum, ...; ranks that update with different ones end with different
//   weights.
// A tag may join several of these with " & " (a traced Keras step: its
// gradient list & its hyperparameters); the first part that differs between
// the two tags decides the wording.
// A tagged step misses the response cache (its signature changed) and so
// does the next untagged one: two slow-path cycles, no extra collective.
//
// Note [Join and process sets]: join() is global (as in Horovod): a joined
// rank contributes identities to the global set's allreduces, but it
// submits nothing to any process set. So a collective other members run on
// a set that includes it cannot complete; before, they waited for ever (no
// bounded wait fires: the joined rank is not blocked on that set's engine).
// Now the global engine keeps a process-wide flag while its join() is
// pending, and each set engine ORs it into the cycle's flags (kFlagJoined):
// while any member has joined, every cycle takes the slow path, cache
// waiters go there at once, and rank 0 fails each name the joined member
// has not submitted and that has waited 2 s, on every rank, naming that
// member (the grace covers the moment a member's flag is still up after
// its join completed elsewhere). Call join() after the last process-set
// collective.
// Note [Withdrawn names]: a rank can fail between naming a collective and
// submitting it (a user Compressor raising, an input only that rank
// refuses). Before, the other ranks waited for it (GRADFLOW_TIMEOUT), and
// if the program caught the error and called again under the same name,
// that call was reduced with the others' earlier one: a step's data paired
// with the previous step's, silently. Now the binding withdraws the name
// (gradflow/_withdrawal.py `preparing`; the core's own refusal in
// _runtime.submit; grouped ops in submitting_group): the rank submits a
// request with no buffers whose `withdrawn` says why. It is negotiated as any request (its
// signature differs from a cached one, so the name goes to the slow path on
// every rank) and validate() turns a complete name with any withdrawal into
// an error response naming the rank and its reason: every rank's handle
// fails with it, the withdrawing rank's entry is dropped unseen
// (TensorQueue::complete), and the next call under that name pairs with the
// next calls. Until then the name is in flight on the withdrawing rank; a
// new call under it there is held in the TensorQueue and goes out when the
// withdrawal completes, so rank 0 never holds two calls of one name from
// one rank (a third call is refused as "submitted twice").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config.h"
#include "engine_links.h"
#include "message.h"
#include "mpi_comm.h"

namespace gradflow {

struct CycleResult {
  std::vector<Response> responses;  // in execution order
  bool shutdown = false;            // some rank called shutdown()
  std::vector<int64_t> shutdown_ranks;  // which ones (this engine's ranks)
  std::string abort_message;        // some rank is failing; names the rank
  double negotiation_seconds = 0.0;
  bool used_slow_path = false;
  size_t fast_responses = 0;  // agreed through cache bits this cycle
  uint64_t cache_evictions = 0;  // cache entries removed this cycle
};

class Coordinator {
 public:
  Coordinator(MpiComm& comm, const Config& cfg);

  // One collective negotiation round. `fresh` are requests submitted on
  // this rank since the last cycle.
  // `blocked_here`: a thread of this rank is waiting on a handle of this
  // engine (Note [Bounded waits]). `blocked` (global engine): on a handle of
  // any engine of the process while nothing moves (Note [Waits across
  // engines], engine_links.h); set engines pass the same for both.
  CycleResult cycle(const std::vector<Request>& fresh, bool shutdown,
                    const std::string& abort_message, bool blocked = false,
                    bool blocked_here = false);

  // What this process's engines share (engine_links.h): the global
  // engine's coordinator (`owner`) keeps the join flag (Note [Join and
  // process sets]) and reports whole-job deadlocks (Note [Waits across
  // engines]); a set engine's reads them. Before the first cycle.
  void set_engine_links(std::shared_ptr<EngineLinks> links, bool owner) {
    links_ = std::move(links);
    owns_links_ = owner;
  }

  // Cache entries removed so far (invalidated, demoted or recycled).
  uint64_t cache_evictions() const { return evictions_; }
  // Stall report lines produced by rank 0 (for logs and tests).
  const std::vector<std::string>& stall_warnings() const { return stall_warnings_; }

 private:
  struct CacheEntry {
    Response response;
    std::string signature;
    uint64_t last_used = 0;  // use_clock_ when last agreed (rank 0 evicts the oldest)
  };
  struct PendingOnRank0 {
    std::vector<Request> by_rank;  // indexed by rank; name empty = not yet
    int count = 0;
    std::chrono::steady_clock::time_point first_seen;
    bool warned = false;
  };

  void build_slow_responses(const std::vector<RequestMessage>& all, ResponseMessage* out,
                            bool deadlock);
  // Rank 0 of a set engine: fails the names a joined member has not
  // submitted (Note [Join and process sets]).
  void fail_names_missing_on_joined(const std::vector<RequestMessage>& all, ResponseMessage* out);
  // `*abort_job`: set when nothing of the ranks' step can complete: their
  // step tags differ (Note [Step tags]) or a grouped op's lists differ in
  // length (Note [Grouped lists]).
  Response validate(const std::string& name, const std::vector<Request>& reqs,
                    std::string* abort_job);
  void check_stalls(ResponseMessage* out, bool deadlock);
  // Rank 0 of the global engine: why the job aborts when every rank waits,
  // not all on this engine (Note [Waits across engines]).
  std::string job_deadlock_message(double blocked_for) const;
  bool stall_action_due() const;
  void insert_cache(const Response& r, const std::string& signature);
  // Removes `bit`'s entry (if any); a request of this rank waiting on it
  // moves to `slow`.
  void evict_bit(int32_t bit, std::vector<Request>* slow);
  int32_t pick_bit(const std::set<int32_t>& taken) const;  // rank 0; -1 if none

  MpiComm& comm_;
  Config cfg_;
  size_t cache_words_;  // words per bit section

  // This rank's requests not yet agreed on.
  std::map<std::string, Request> waiting_on_cache_;  // name -> request (bit set each cycle)
  std::map<std::string, std::chrono::steady_clock::time_point> cache_wait_since_;
  std::map<std::string, Request> sent_to_rank0_;     // awaiting rank 0's response

  // Cache, identical on every rank.
  std::map<std::string, int32_t> cache_bit_of_;
  std::map<int32_t, CacheEntry> cache_;
  uint64_t use_clock_ = 0;  // counts cache uses, identical on every rank
  uint64_t evictions_ = 0;
  std::vector<Request> slow_next_cycle_;  // waited on a bit rank 0 recycled

  // Rank 0 only: requests seen so far, in first-arrival order.
  std::list<std::string> table_order_;
  std::map<std::string, PendingOnRank0> table_;
  std::vector<std::string> stall_warnings_;
  std::set<int> joined_ranks_;  // rank 0: ranks that called join() this round
  int last_joined_rank_ = -1;   // rank 0: the latest of them (join() returns it)

  bool joined_ = false;  // this rank called join() and waits for the others
  // Note [Join and process sets], Note [Waits across engines].
  std::shared_ptr<EngineLinks> links_;
  bool owns_links_ = false;
  bool member_joined_ = false;  // a set member had joined as of the last cycle

  // Note [Bounded waits]: every rank blocked in wait() while no response
  // runs cannot end by itself (names that never match, a collective only
  // some ranks issued). Each cycle ANDs the ranks' `blocked` flags; once
  // all are blocked with nothing agreed for GRADFLOW_TIMEOUT / 2, cached
  // waiters are demoted to the slow path, and after GRADFLOW_TIMEOUT rank 0
  // fails every pending name on every rank, saying who submitted what.
  // This spell counts waits on this engine (`blocked_here`).
  bool all_blocked_ = false;
  std::chrono::steady_clock::time_point all_blocked_since_;
  // Note [Waits across engines] (engine_links.h), global engine: every rank
  // blocked on any engine of its process while nothing moves (`blocked`).
  bool job_blocked_ = false;
  std::chrono::steady_clock::time_point job_blocked_since_;
};

}  // namespace gradflow
