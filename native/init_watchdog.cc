// init_watchdog.cc — see init_watchdog.h.
#include "init_watchdog.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace gradflow {
namespace {

// Heap-allocated and never freed (init_watchdog.h: no destructor may run
// at exit() while the watchdog thread waits on them).
struct WatchdogState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t armed = 0;  // generation of the armed watchdog; 0: none
  uint64_t next = 0;
};
WatchdogState& state() {
  static WatchdogState* s = new WatchdogState;
  return *s;
}

}  // namespace

void arm_init_watchdog(double seconds) {
  WatchdogState& s = state();
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    generation = s.armed = ++s.next;
  }
  s.cv.notify_all();  // an older watchdog thread sees it was replaced and leaves
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::thread([&s, generation, deadline, seconds] {
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.cv.wait_until(lock, deadline, [&] { return s.armed != generation; })) return;
    const std::string line =
        "gradflow: init() has waited " + std::to_string(static_cast<int>(seconds)) +
        " s (GRADFLOW_INIT_TIMEOUT) for MPI to start on every rank of the job: some rank has "
        "not called gradflow.init() (it is still busy before it, hangs, or exited without "
        "calling it?). Exiting with code 1; MPI cannot be finalized.\n";
    // write(2) directly: no stdio locks, and the process ends right after.
    ssize_t ignored = ::write(2, line.data(), line.size());
    (void)ignored;
    ::_exit(1);
  }).detach();
}

void disarm_init_watchdog() {
  WatchdogState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.armed = 0;
  }
  s.cv.notify_all();
}

}  // namespace gradflow
