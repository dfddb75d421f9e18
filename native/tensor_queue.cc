// tensor_queue.cc — submit queue, handle table and in-flight name set.
#include "tensor_queue.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace gradflow {

namespace {
// Handle ids are unique in the process, not per queue: a handle still held
// from before shutdown() must not alias a handle of the runtime created by
// the next init() (it is "unknown" there instead).
std::atomic<int64_t> g_next_handle{1};

// Note [Short spins] (tensor_queue.h): polls `counter` until it moves past
// `seen` or `until` passes, yielding the core between polls. It only ends the
// short spin early; the caller then takes mu_ and checks its state there.
void yield_until_counter_moves(const std::atomic<uint64_t>& counter, uint64_t seen,
                               std::chrono::steady_clock::time_point until) {
  while (counter.load(std::memory_order_acquire) == seen &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
}
}  // namespace

int64_t TensorQueue::submit(TensorEntry entry) {
  std::unique_lock<std::mutex> lock(mu_);
  GF_CHECK(!closed_, close_reason_);
  const std::string& name = entry.request.name;
  const bool withdrawal = !entry.request.withdrawn.empty();
  // Note [Withdrawing a name in flight]: this rank refused a second call
  // under a name its first call still holds ("submitted twice"), and the
  // binding withdraws the refused call. A rank whose first call had
  // completed by then accepted its second call, which used to pair with
  // this rank's next call under the name, and every call after it one
  // behind, silently (2 ranks, per step a Sum of step+1 and then of
  // 100+step under one name, unwaited: at step 1 rank 1 got 102 and
  // rank 0 got 5, both expecting 4). Refused as "submitted twice" too, the
  // withdrawal was lost. So every call of this rank under a name keeps its
  // place: an accepted call, or the withdrawal of a refused or failed one.
  // While anything under the name is in flight here, the next entry waits
  // behind it in held_ (FIFO per name) and goes out when it completes
  // (complete()): a withdrawal behind this rank's first call, so the ranks
  // that accepted their second call see it fail with this rank's error; a
  // call behind a withdrawal (Note [Withdrawn names]); and, where the
  // first call was itself held behind a withdrawal, the refused call's
  // withdrawal behind that call (before, dropped: rank 0's third call then
  // summed with the others' fourth, 2 ranks, withdrawn_held_script.py).
  // A call is refused while a call (not a withdrawal) of this rank under
  // the name is in flight or held: withdrawals have no caller to wait.
  const bool in_flight = in_flight_names_.count(name) > 0;
  auto held = held_.find(name);
  const bool call_pending =
      (in_flight && !withdrawn_names_.count(name)) ||
      (held != held_.end() &&
       std::any_of(held->second.begin(), held->second.end(),
                   [](const TensorEntry& e) { return e.request.withdrawn.empty(); }));
  // An invalid argument (ValueError), as in Horovod.
  GF_CHECK_ARG(withdrawal || !call_pending,
               "gradflow: " << op_kind_name(entry.request.kind) << " '" << name
                            << "' was submitted twice on rank " << entry.request.rank
                            << " before the first one completed; use distinct names or wait "
                               "for the first handle");
  entry.handle = g_next_handle++;
  entry.submitted = std::chrono::steady_clock::now();
  in_flight_handles_.insert(entry.handle);
  const int64_t h = entry.handle;
  if (in_flight) {
    held_[name].push_back(std::move(entry));
    return h;
  }
  queue_locked(std::move(entry));
  lock.unlock();
  wake_cv_.notify_all();
  return h;
}

void TensorQueue::queue_locked(TensorEntry entry) {
  in_flight_names_.insert(entry.request.name);
  if (!entry.request.withdrawn.empty()) withdrawn_names_.insert(entry.request.name);
  queue_.push_back(std::move(entry));
  // Wake the background loop: a sleeping loop starts its next cycle now
  // instead of at the end of GRADFLOW_CYCLE_TIME (see BackgroundLoop::cycle).
  wakes_.fetch_add(1, std::memory_order_release);
}

std::vector<TensorEntry> TensorQueue::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  // What woke the loop is taken now: a stale wake would end the next sleep
  // (or the poll after work, Note [Cycle pacing]) for an empty exchange.
  // notify()'s flags (shutdown, abort) are read by the cycle after drain().
  wakes_taken_ = wakes_.load(std::memory_order_relaxed);
  std::vector<TensorEntry> out(std::make_move_iterator(queue_.begin()),
                               std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

void TensorQueue::complete(const TensorEntry& entry, HandleResult result) {
  bool queued = false, finished = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_names_.erase(entry.request.name);
    withdrawn_names_.erase(entry.request.name);
    in_flight_handles_.erase(entry.handle);
    // The next entry held under this name goes out now (Note [Withdrawing
    // a name in flight], submit()).
    auto held = held_.find(entry.request.name);
    if (held != held_.end()) {
      queue_locked(std::move(held->second.front()));
      held->second.pop_front();
      if (held->second.empty()) held_.erase(held);
      queued = true;
    }
    // A withdrawal has no caller: nobody holds its handle and its completion
    // is dropped (Note [Withdrawn names]); so is the result of a released
    // handle nobody waits on.
    if (entry.request.withdrawn.empty()) {
      finished = true;
      if (released_.erase(entry.handle)) {
        reaped_.push_back(entry.handle);
        finished = waiters_.count(entry.handle) > 0;
      }
      if (finished) {
        finished_[entry.handle] = std::make_shared<HandleResult>(std::move(result));
        completions_.fetch_add(1, std::memory_order_release);
      }
    }
  }
  if (queued) wake_cv_.notify_all();
  if (finished) done_cv_.notify_all();
}

bool TensorQueue::poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_.count(handle)) return true;
  GF_CHECK(in_flight_handles_.count(handle) && !released_.count(handle),
           "gradflow: unknown or already waited handle " << handle);
  return false;
}

std::optional<HandleResult> TensorQueue::wait(int64_t handle,
                                              const std::function<bool()>& interrupted) {
  std::unique_lock<std::mutex> lock(mu_);
  GF_CHECK(finished_.count(handle) || (in_flight_handles_.count(handle) && !released_.count(handle)),
           "gradflow: unknown or already waited handle " << handle);
  // Every in-flight handle completes (BackgroundLoop::fail_all completes the
  // rest when the loop stops), so this wait ends. Several threads may wait on
  // one handle: each gets the result, the last one out forgets it.
  ++waiters_[handle];
  // Counted process-wide too while it waits (Note [Waits across engines]);
  // a wait that begins is movement: the job's clock starts after the last.
  struct ProcessWaiter {
    EngineLinks* links;
    explicit ProcessWaiter(EngineLinks* l) : links(l) {
      if (!links) return;
      links->waiting_threads.fetch_add(1);
      links->progress.fetch_add(1);
    }
    ~ProcessWaiter() {
      if (links) links->waiting_threads.fetch_sub(1);
    }
  } process_waiter(links_.get());
  if (!finished_.count(handle)) {
    // Note [Short spins] (tensor_queue.h): poll a little before sleeping.
    const uint64_t seen = completions_.load(std::memory_order_acquire);
    lock.unlock();
    yield_until_counter_moves(completions_, seen, std::chrono::steady_clock::now() + kWaitSpin);
    lock.lock();
  }
  auto done = [&] { return finished_.count(handle) > 0; };
  if (!interrupted) {
    done_cv_.wait(lock, done);
  } else {
    while (!done_cv_.wait_for(lock, kInterruptCheck, done)) {
      lock.unlock();
      const bool stop = interrupted();
      lock.lock();
      if (stop && !done()) {
        if (--waiters_[handle] == 0) waiters_.erase(handle);
        return std::nullopt;
      }
    }
  }
  std::shared_ptr<HandleResult> r = finished_[handle];
  if (--waiters_[handle] == 0) {
    waiters_.erase(handle);
    finished_.erase(handle);
  }
  return *r;
}

bool TensorQueue::release(int64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_handles_.count(handle)) {
    released_.insert(handle);
    return false;
  }
  if (!waiters_.count(handle)) finished_.erase(handle);  // else the last waiter does
  return true;
}

std::vector<int64_t> TensorQueue::take_reaped() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  out.swap(reaped_);
  return out;
}

bool TensorQueue::someone_waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !waiters_.empty();  // an entry exists only while some thread waits on it
}

bool TensorQueue::holds_handles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !in_flight_handles_.empty() || !finished_.empty();
}

std::vector<TensorEntry> TensorQueue::close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) {
    closed_ = true;
    close_reason_ = reason;
  }
  std::vector<TensorEntry> out(std::make_move_iterator(queue_.begin()),
                               std::make_move_iterator(queue_.end()));
  queue_.clear();
  for (auto& kv : held_)
    for (auto& e : kv.second) out.push_back(std::move(e));
  held_.clear();
  return out;
}

void TensorQueue::fail_in_flight(const std::string& reason) {
  close(reason);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t h : in_flight_handles_) {
      const bool released = released_.erase(h) > 0;
      if (released) reaped_.push_back(h);
      if ((!released || waiters_.count(h)) && !finished_.count(h)) {
        HandleResult r;
        r.error = reason;
        finished_[h] = std::make_shared<HandleResult>(std::move(r));
      }
    }
    in_flight_handles_.clear();
    in_flight_names_.clear();
    withdrawn_names_.clear();
    completions_.fetch_add(1, std::memory_order_release);
  }
  done_cv_.notify_all();
}

bool TensorQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::string TensorQueue::close_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return close_reason_;
}

void TensorQueue::notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wakes_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
}

void TensorQueue::sleep_until(std::chrono::steady_clock::time_point deadline,
                              std::chrono::microseconds spin) {
  if (spin.count() > 0) {
    // Note [Short spins]: a wake that comes within `spin` costs no futex.
    // Counted from the last wake the loop took, so a submit that came while
    // the cycle ran ends the poll at once; the wait below (under mu_)
    // decides.
    yield_until_counter_moves(wakes_, wakes_taken_,
                              std::min(deadline, std::chrono::steady_clock::now() + spin));
  }
  std::unique_lock<std::mutex> lock(mu_);
  wake_cv_.wait_until(lock, deadline, [&] {
    return wakes_.load(std::memory_order_relaxed) != wakes_taken_;
  });
  wakes_taken_ = wakes_.load(std::memory_order_relaxed);
}

}  // namespace gradflow
