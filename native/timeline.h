// timeline.h — Chrome-trace (chrome://tracing, Perfetto) writer. One row per
// tensor name (a process set's: "set<id>/<name>", engine_links.h): a
// NEGOTIATE span (submitted -> agreed by all ranks) and an execution span
// named after the collective, with the algorithm, wire dtype, bytes and
// codec time as args; instant events mark steps. Only the rank that opened
// a file writes; a disabled Timeline costs one branch per event.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

namespace gradflow {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens `path` (truncating) if non-empty; otherwise the timeline is off.
  // Called again while open (start_timeline at run time), it closes the
  // current file first, as Horovod switches files.
  void open(const std::string& path, int rank);
  void close();
  ~Timeline() { close(); }
  bool enabled() const { return file_.load(std::memory_order_acquire) != nullptr; }
  // Horovod's mark_cycles: an instant event per background-loop cycle that
  // carried work, on a "cycles" row (a process set's: "set<id>/cycles"; idle
  // cycles are not marked).
  void set_mark_cycles(bool on) { mark_cycles_.store(on); }
  void cycle(const std::string& row = "cycles");

  // A complete span on the tensor's row. `args_json` is a JSON object body
  // (e.g. "\"algo\": \"ring\"") or empty.
  void span(const std::string& tensor, const char* name, Clock::time_point start,
            Clock::time_point end, const std::string& args_json);
  // An instant event on `row` ("steps": optimizer step boundaries;
  // "cycles": GRADFLOW_TIMELINE_MARK_CYCLES).
  void mark(const std::string& name, const std::string& row = "steps");

 private:
  int row_of(const std::string& tensor);  // caller holds mu_
  void close_locked();                    // caller holds mu_
  void write_event(const std::string& json);  // caller holds mu_
  double micros(Clock::time_point t) const;

  std::mutex mu_;
  // Atomic: enabled() reads it without the lock from the loop thread while
  // start/stop_timeline swap it from a Python thread.
  std::atomic<std::FILE*> file_{nullptr};
  std::atomic<bool> mark_cycles_{false};
  bool first_event_ = true;
  int rank_ = 0;
  Clock::time_point origin_;
  std::map<std::string, int> rows_;
};

// Escapes a string for inclusion in JSON.
std::string json_escape(const std::string& s);

}  // namespace gradflow
