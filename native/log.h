// log.h — the core's stderr log with one process-wide level, set from
// GRADFLOW_LOG_LEVEL at Runtime start (trace < debug < info < warning <
// error < fatal; default warning). Header-only; a disabled level costs one
// relaxed atomic load. Lines read "[gradflow rank R] LEVEL: message", R the
// process's global rank (also on a process set's engine).
#pragma once

#include <atomic>
#include <cstdio>
#include <sstream>
#include <string>

namespace gradflow {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

inline std::atomic<int>& log_level_ref() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kWarning)};
  return level;
}
inline void set_log_level(LogLevel l) { log_level_ref().store(static_cast<int>(l)); }
inline bool log_enabled(LogLevel l) {
  return static_cast<int>(l) >= log_level_ref().load(std::memory_order_relaxed);
}
// `name` is one of the lower-case GRADFLOW_LOG_LEVEL choices (validated by config.cc).
inline LogLevel parse_log_level(const std::string& name) {
  static const char* kNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i)
    if (name == kNames[i]) return static_cast<LogLevel>(i);
  return LogLevel::kWarning;
}
inline const char* log_level_name(LogLevel l) {
  static const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  return kNames[static_cast<int>(l)];
}
// This process's rank in the job (set by the global engine; -1 before). A
// process-set engine logs with its communicator's rank, which counts the
// set's members: the prefix names the process by its global rank instead,
// so a set engine's line is not taken for another process's.
inline std::atomic<int>& log_process_rank_ref() {
  static std::atomic<int> rank{-1};
  return rank;
}
// One whole line per call (a single fprintf), so ranks' lines do not interleave mid-line.
inline void log_line(LogLevel l, int rank, const std::string& msg) {
  const int global = log_process_rank_ref().load(std::memory_order_relaxed);
  std::fprintf(stderr, "[gradflow rank %d] %s: %s\n", global >= 0 ? global : rank,
               log_level_name(l), msg.c_str());
}

}  // namespace gradflow

// GF_LOG(kDebug, rank, "cycle " << n): the stream expression is evaluated
// only when the level is enabled.
#define GF_LOG(level, rank, expr)                                      \
  do {                                                                 \
    if (::gradflow::log_enabled(::gradflow::LogLevel::level)) {        \
      std::ostringstream gf_log_os_;                                   \
      gf_log_os_ << expr;                                              \
      ::gradflow::log_line(::gradflow::LogLevel::level, (rank), gf_log_os_.str()); \
    }                                                                  \
  } while (0)
