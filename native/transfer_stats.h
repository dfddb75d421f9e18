// transfer_stats.h — what one collective's algorithm reports (bytes, codec
// time, wall time, wire overflow) and the frame every algorithm's entry
// point shares: report into the caller's stats or a local one, and time the
// whole call.
#pragma once

#include <chrono>
#include <cstdint>

#include "common.h"

namespace gradflow {

// Bytes moved by one collective, filled in by the algorithms.
struct TransferStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double codec_seconds = 0.0;     // time in encode/decode
  double transfer_seconds = 0.0;  // wall time of the whole algorithm
  bool wire_overflow = false;     // a finite value became inf on the 16-bit wire
};

// Runs body(st) with st = `stats`, or a local TransferStats when the caller
// passed none (algorithms then never test for null), and adds the wall time
// of the call to st->transfer_seconds.
template <class Body>
void timed_transfer(TransferStats* stats, Body&& body) {
  TransferStats local;
  TransferStats* st = stats ? stats : &local;
  const auto t0 = std::chrono::steady_clock::now();
  body(st);
  st->transfer_seconds += seconds_since(t0);
}

// Runs fn() and adds its wall time to st->codec_seconds (wire encode/decode).
template <class Fn>
void timed_codec(TransferStats* st, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  st->codec_seconds += seconds_since(t0);
}

}  // namespace gradflow
