// init_watchdog.cc — see init_watchdog.h.
#include "init_watchdog.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace gradflow {
namespace {

std::mutex g_mu;
std::condition_variable g_cv;
uint64_t g_armed = 0;  // generation of the armed watchdog; 0: none

}  // namespace

void arm_init_watchdog(double seconds) {
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    static uint64_t next = 0;
    generation = g_armed = ++next;
  }
  g_cv.notify_all();  // an older watchdog thread sees it was replaced and leaves
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::thread([generation, deadline, seconds] {
    std::unique_lock<std::mutex> lock(g_mu);
    if (g_cv.wait_until(lock, deadline, [&] { return g_armed != generation; })) return;
    const std::string line =
        "gradflow: init() has waited " + std::to_string(static_cast<int>(seconds)) +
        " s (GRADFLOW_TIMEOUT) for MPI to start on every rank of the job: some rank has not "
        "called gradflow.init() (it is still busy before it, hangs, or exited without calling "
        "it?). Exiting with code 1; MPI cannot be finalized.\n";
    // write(2) directly: no stdio locks, and the process ends right after.
    ssize_t ignored = ::write(2, line.data(), line.size());
    (void)ignored;
    ::_exit(1);
  }).detach();
}

void disarm_init_watchdog() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_armed = 0;
  }
  g_cv.notify_all();
}

}  // namespace gradflow
