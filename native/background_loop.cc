// background_loop.cc — the communication thread's cycle.
#include "background_loop.h"

#include <algorithm>

#include "log.h"
#include "tuning.h"

#include <chrono>
#include <cctype>
#include <cstdio>
#include <sstream>
#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace gradflow {

BackgroundLoop::BackgroundLoop(MpiComm& comm, const Config& cfg, TensorQueue& queue, Stats& stats,
                               Timeline& timeline)
    : comm_(comm),
      cfg_(cfg),
      queue_(queue),
      stats_(stats),
      timeline_(timeline),
      coordinator_(comm, cfg),
      executor_(comm, cfg, stats) {}

BackgroundLoop::~BackgroundLoop() { shutdown(); }

void BackgroundLoop::start() { thread_ = std::thread([this] { run(); }); }

void BackgroundLoop::shutdown() {
  shutdown_requested_ = true;
  queue_.notify();
  if (!thread_.joinable()) return;
  {
    // A loop thread inside an MPI call without deadline waits for a dead
    // peer for ever: given up (by the notice, a waiter, or here once it is
    // overdue), it is left behind (Note [Blocking MPI calls], mpi_comm.h).
    std::unique_lock<std::mutex> lock(exit_mu_);
    while (!exited_ && !abandoned_) {
      if (exit_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return exited_; })) break;
      lock.unlock();
      give_up_if_blocked(true);
      lock.lock();
    }
    if (!exited_) {
      thread_.detach();
      return;
    }
  }
  thread_.join();
}

bool BackgroundLoop::give_up_if_blocked(bool overdue_only) {
  if (abandoned_) return false;
  const std::string why = comm_.abandon_blocking_call(overdue_only);
  if (why.empty()) return false;
  // The loop thread touches nothing from now on (it parks if MPI returns),
  // so its state is this thread's: fail what it held, as run() would.
  abandoned_ = true;
  fatal_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = why;
  }
  GF_LOG(kError, comm_.rank(), why);
  queue_.fail_in_flight(why);
  if (on_fatal_) on_fatal_(why);
  return true;
}

void BackgroundLoop::abort(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_message_.empty()) abort_message_ = message.empty() ? "unknown error" : message;
  }
  queue_.notify();
}

std::string BackgroundLoop::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::string BackgroundLoop::shutdown_message(const std::vector<int64_t>& ranks) const {
  // Named, because "some rank" left a user of many ranks to find which
  // program ended early (a rank with fewer batches that returned or
  // sys.exit()ed while the others still trained).
  std::ostringstream os;
  os << "shutdown() was called on ";
  if (ranks.empty()) {
    os << "some rank";
  } else {
    os << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  }
  os << " before this collective ran (its program ended, or called shutdown(), while this "
        "rank still ran collectives)";
  return os.str();
}

void BackgroundLoop::fail_all(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = reason;
  }
  // Queued entries are failed apart from pending_: a call held back behind
  // its withdrawn name (Note [Withdrawn names]) shares the name's key.
  std::vector<TensorEntry> queued = queue_.close(reason);
  auto fail = [&](const TensorEntry& e) {
    HandleResult r;
    r.error = reason + " (while '" + e.request.name + "' was pending)";
    queue_.complete(e, std::move(r));
  };
  for (auto& kv : pending_) fail(kv.second);
  pending_.clear();
  for (const TensorEntry& e : queued) fail(e);
}

void BackgroundLoop::run() {
#ifdef __linux__
  // Short sleeps in MPI polling and cycle pacing must be short in fact: the
  // default 50 us timer slack would double them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // A name for `top -H` and /proc/<pid>/task/*/comm (benchmarks/_trainbench.py
  // reports this thread's CPU time by it).
  prctl(PR_SET_NAME, "gradflow-loop", 0, 0, 0);
#endif
  try {
    while (cycle()) {
    }
  } catch (const std::exception& e) {
    GF_LOG(kError, comm_.rank(), e.what());
    fatal_ = true;
    fail_all(std::string(e.what()));
  }
  fail_all("gradflow has been shut down");
  // Note [Collective destruction] (mpi_comm.h): after an agreed stop every
  // rank's loop is here in the same cycle, so windows are freed together;
  // after a failure a peer may be gone, so nothing collective is freed.
  if (fatal_) {
    comm_.mark_broken();
    if (on_fatal_) on_fatal_(failure());
  } else {
    executor_.release_windows();
  }
  std::lock_guard<std::mutex> lock(exit_mu_);
  exited_ = true;
  exit_cv_.notify_all();
}

bool BackgroundLoop::cycle() {
  using clock = std::chrono::steady_clock;
  const auto cycle_time = std::chrono::microseconds(static_cast<int64_t>(cfg_.cycle_time_ms * 1000));
  auto next = clock::now() + cycle_time;
  std::vector<Request> fresh;
  for (TensorEntry& e : queue_.drain()) {
    fresh.push_back(e.request);
    std::string name = e.request.name;
    pending_.emplace(name, std::move(e));
  }
  std::string abort_message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_message = abort_message_;
  }
  const bool blocked_here = queue_.someone_waits();
  CycleResult res = coordinator_.cycle(fresh, shutdown_requested_, abort_message,
                                       blocked(blocked_here), blocked_here);
  agreed_at_ = clock::now();
  stats_.add("seconds_negotiation", res.negotiation_seconds);
  stats_.add("negotiation.cycles", 1);
  if (res.used_slow_path) stats_.add("negotiation.slow_path_cycles", 1);
  if (res.fast_responses) stats_.add("negotiation.fast_responses", static_cast<double>(res.fast_responses));
  if (res.cache_evictions) stats_.add("negotiation.cache_evictions", static_cast<double>(res.cache_evictions));
  if (!res.responses.empty()) {
    stats_.add("negotiation.cycles_with_work", 1);
    ++cycles_with_work_;
    // A CYCLE_START mark when mark_cycles is on.
    if (timeline_.enabled()) timeline_.cycle(timeline_rows_ + "cycles");
    GF_LOG(kDebug, comm_.rank(),
           "cycle " << cycles_with_work_ << ": " << res.responses.size() << " response(s), "
                    << fresh.size() << " new submission(s), "
                    << (res.used_slow_path ? "slow path (rank 0)" : "bit vector only") << ", "
                    << res.fast_responses << " from the cache, negotiation "
                    << res.negotiation_seconds * 1e3 << " ms");
    for (const Response& r : res.responses)
      GF_LOG(kTrace, comm_.rank(), "  " << op_kind_name(r.kind) << " '" << r.name << "'"
                                        << (r.error.empty() ? "" : " error: " + r.error));
  }
  // Stall warnings are raised on rank 0 only (its coordinator sees every rank).
  const size_t stalls = coordinator_.stall_warnings().size();
  if (stalls > stall_warnings_counted_) {
    stats_.add("stall_warnings", static_cast<double>(stalls - stall_warnings_counted_));
    stall_warnings_counted_ = stalls;
  }

  // Execute the agreed list front to back (Note [Execution order]).
  if (!res.responses.empty()) execute(res.responses);
  if (!res.abort_message.empty()) {
    fatal_ = true;
    fail_all("gradflow: aborting because " + res.abort_message);
    return false;
  }
  if (res.shutdown) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reason = shutdown_reason_;
    }
    fail_all("gradflow: " + (reason.empty() ? shutdown_message(res.shutdown_ranks) : reason));
    return false;
  }
  // When to start the next cycle (Note [Cycle pacing] in background_loop.h).
  if (!res.responses.empty() || !pending_.empty()) idle_cycles_ = 0;
  if (!res.responses.empty() && pending_.empty()) {
    // Work ran and this rank has nothing left: an exchange now would carry
    // nothing from it, and no collective can be agreed without its next
    // submit. Wait for that submit (a short poll, then a sleep) up to one
    // cycle time before exchanging (Note [Cycle pacing]); a submit,
    // shutdown() or abort() ends the wait at once.
    queue_.sleep_until(clock::now() + cycle_time, kLoopWakeSpin);
  } else if (res.responses.empty()) {
    auto soon = clock::now() + kPendingRecheck;
    if (pending_.empty()) {
      // Idle backoff: cycle time x 2^(idle cycles in a row - 1), capped.
      const double cap = std::max(cfg_.cycle_time_ms, cfg_.idle_cycle_max_ms);
      const double ms = std::min(cap, cfg_.cycle_time_ms * static_cast<double>(1 << idle_cycles_));
      idle_cycles_ = std::min(idle_cycles_ + 1, 20);  // 2^20 x the cycle time is past any cap
      const auto extra = static_cast<int64_t>((ms - cfg_.cycle_time_ms) * 1000);
      // The poll for the next submit ran before this exchange (above).
      queue_.sleep_until(next + std::chrono::microseconds(extra));
    } else {
      queue_.sleep_until(next < soon ? next : soon);
    }
  }
  return true;
}

void BackgroundLoop::execute(const std::vector<Response>& responses) {
  using clock = std::chrono::steady_clock;
  // While this runs, no engine of this process counts as blocked, and its
  // end is progress (Note [Waits across engines]: a long collective is not
  // a deadlock).
  struct Executing {
    EngineLinks* links;
    explicit Executing(EngineLinks* l) : links(l) {
      if (links) links->executing.fetch_add(1);
    }
    ~Executing() {
      if (!links) return;
      links->progress.fetch_add(1);
      links->executing.fetch_sub(1);
    }
  } executing(links_.get());
  std::vector<size_t> groups = executor_.plan(responses);
  size_t at = 0;
  for (size_t g : groups) {
    std::vector<const Response*> group;
    std::vector<TensorEntry*> entries;
    for (size_t i = at; i < at + g; ++i) {
      group.push_back(&responses[i]);
      auto it = pending_.find(responses[i].name);
      entries.push_back(it == pending_.end() ? nullptr : &it->second);
    }
    at += g;
    bool any_local = false;
    for (TensorEntry* e : entries) any_local = any_local || e != nullptr;
    // A response this rank never asked for and cannot take part in (a
    // stall error for another rank's name) needs no work here.
    if (!any_local && !group[0]->error.empty()) continue;
    std::vector<HandleResult> results;
    auto started = clock::now();
    try {
      executor_.run_group(group, entries, &results);
    } catch (const TransportError&) {
      throw;  // MPI or a peer failed: fatal (run() fails everything)
    } catch (const std::exception& e) {
      // Executing an agreed response failed for a reason that is the same on
      // every rank (e.g. a kernel refusing the input): fail this group's
      // handles everywhere and keep the runtime alive.
      results.assign(group.size(), HandleResult{});
      for (size_t i = 0; i < group.size(); ++i)
        results[i].error = std::string(e.what()) + " (" + op_kind_name(group[i]->kind) + " '" +
                           group[i]->name + "')";
      stats_.add("responses_failed", 1);
    }
    for (size_t i = 0; i < group.size(); ++i)
      if (entries[i] && group[i]->kind == OpKind::kBroadcast && is_tuning_name(group[i]->name))
        apply_tuning(*group[i], *entries[i], &results[i]);
    if (timeline_.enabled()) trace_group(group, entries, started);
    for (size_t i = 0; i < group.size(); ++i) {
      if (!entries[i]) continue;
      // The coordinator's decisions (mismatches, bounded waits) are the same
      // on every rank; an error met while executing may be this rank's own
      // (an allocation), so it is not marked.
      results[i].agreed = !group[i]->error.empty();
      queue_.complete(*entries[i], std::move(results[i]));
      pending_.erase(group[i]->name);
    }
  }
}

bool BackgroundLoop::blocked(bool blocked_here) {
  if (!owns_links_) return blocked_here;
  // `executing` before `progress`: an execution ends by bumping progress
  // and then leaving executing, so one ending between the reads shows.
  const bool executing = links_->executing.load() != 0;
  const uint64_t progress = links_->progress.load();
  const bool moved = progress != progress_seen_;
  progress_seen_ = progress;
  return links_->waiting_threads.load() > 0 && !executing && !moved;
}

void BackgroundLoop::apply_tuning(const Response& r, const TensorEntry& e, HandleResult* result) {
  if (!result->error.empty()) return;
  try {
    GF_CHECK(r.dtype == DataType::kFloat64 && e.output,
             "gradflow: an autotune decision ('" << kTuningPrefix << "*' broadcast) must be float64");
    size_t n = 1;
    for (int64_t d : r.shape) n *= static_cast<size_t>(d);
    Tuning t = decode_tuning(static_cast<const double*>(e.output), n);
    executor_.set_tuning(t.algo, t.ring_pipeline_bytes);
    cfg_.allreduce_algo = t.algo;
    cfg_.ring_pipeline_bytes = t.ring_pipeline_bytes;
    cfg_.cycle_time_ms = t.cycle_time_ms;
    stats_.add("autotune.applied", 1);
    GF_LOG(kInfo, comm_.rank(),
           "autotune: " << r.name << " applied: algo " << allreduce_algo_name(t.algo)
                        << ", ring piece " << t.ring_pipeline_bytes << " B, cycle "
                        << t.cycle_time_ms << " ms");
  } catch (const std::exception& ex) {
    // The broadcast data is the same on every rank: every rank refuses it.
    result->error = ex.what();
  }
}

void BackgroundLoop::trace_group(const std::vector<const Response*>& group,
                                 const std::vector<TensorEntry*>& entries,
                                 std::chrono::steady_clock::time_point started) {
  auto ended = std::chrono::steady_clock::now();
  const auto& run = executor_.last_run();
  for (size_t i = 0; i < group.size(); ++i) {
    const Response& r = *group[i];
    const std::string row = timeline_rows_ + r.name;
    if (entries[i]) timeline_.span(row, "NEGOTIATE", entries[i]->submitted, agreed_at_, "");
    std::string args = "\"fused_with\": " + std::to_string(group.size() - 1) +
                       ", \"bytes_sent\": " + std::to_string(run.transfer.bytes_sent) +
                       ", \"codec_us\": " + std::to_string(run.transfer.codec_seconds * 1e6);
    if (r.kind == OpKind::kAllreduce)
      args += std::string(", \"algo\": \"") +
              (r.op == ReduceOp::kAdasum ? "adasum" : allreduce_algo_name(run.algo)) +
              "\", \"wire\": \"" + wire_dtype_name(run.wire) +
              "\", \"sparse\": " + (run.sparse ? "true" : "false");
    if (!r.error.empty()) args += ", \"error\": \"" + json_escape(r.error) + "\"";
    std::string name = op_kind_name(r.kind);
    for (auto& c : name) c = static_cast<char>(std::toupper(c));
    timeline_.span(row, name.c_str(), started, ended, args);
  }
}

}  // namespace gradflow
