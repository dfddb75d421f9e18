// adasum_allreduce.cc — Adasum by vector-halving distance-doubling (VHDD).
// The pairwise rule, the tree and the supported sizes are in the header.
//
// The algorithm
// -------------
// 2^k ranks, buffer of `total` elements (several tensors back to back).
//
//   Phase 1, k halving levels, distance d = 1, 2, 4, ... Rank r and its
//   partner r^d hold the same element range [lo, hi) (their paths so far
//   depended only on the bits below d). The range is cut at
//   mid = lo + (hi-lo)/2; the rank with bit d clear (the "left" one, whose
//   group has the lower ranks) keeps [lo, mid), the other keeps [mid, hi);
//   each sends the half it gives up and receives the partner's values of the
//   half it keeps. Now the 2d ranks of the aligned block containing r hold,
//   between them, all of the left group's combined vector L and the right
//   group's R, each rank a disjoint slice. For every tensor each rank sums
//   L.R, |L|^2 and |R|^2 over its slice in double; the block adds the
//   partial sums (group_sum) so every member has the whole tensors'
//   numbers; each rank replaces its slice by cL*L + cR*R.
//   Phase 2, k doubling levels in reverse: partners swap their slices, so
//   after k levels every rank holds the whole result.
//
// Bitwise identity. Every result element is computed by exactly one rank
// and then copied, so ranks can only differ through the coefficients; those
// come from group_sum, which adds partial sums in a fixed tree (the lower
// half's sum + the upper half's sum at every level, the same operands in the
// same order on both partners), so every member of a block gets the same
// bits. MPI_Allreduce is not used for this: MPI does not promise that every
// rank gets the same bits for a floating-point sum.
//
// Cost. Each rank sends and receives (1 - 1/N) of the buffer in each phase
// (like a recursive-halving reduce-scatter + recursive-doubling allgather),
// plus 3 doubles per tensor per level and sub-level for the dot products:
// O(log^2 N) small messages.
//
// Message order. Every exchange of this file is between the two partners of
// one level on kTagAdasum, receive posted before send; the levels run one
// after another, so MPI's per-pair FIFO order matches every message.
#include "adasum_allreduce.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "wire_codec.h"

namespace gradflow {
namespace {

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Coefficient of an operand with squared norm `normsq` (Horovod's rule: a
// zero, or denormal-small, operand keeps coefficient 1, so adasum(a, 0) = a
// and adasum(0, 0) = 0 without dividing by zero).
double coefficient(double dot, double normsq) {
  static const double kTiny = std::sqrt(DBL_MIN);
  return normsq >= kTiny ? 1.0 - dot / normsq * 0.5 : 1.0;
}

// Largest single MPI message: counts are ints (bytes).
constexpr size_t kMaxPiece = size_t{1} << 30;

}  // namespace

bool adasum_supported(DataType dt, int comm_size, std::string* why) {
  std::string reason;
  if (!is_floating(dt)) {
    reason = std::string("Adasum of ") + dtype_name(dt) +
             " tensors is not supported; Adasum needs float16, bfloat16, float32 or float64";
  } else if (!is_power_of_two(comm_size)) {
    // comm_size: the job's ranks, or a process set's members (its engine).
    reason = "Adasum needs a power-of-two number of ranks (as in Horovod), but it runs on " +
             std::to_string(comm_size) + " ranks; use Average or Sum, or run on 1, 2, 4, 8, ... "
             "ranks";
  }
  if (reason.empty()) return true;
  if (why) *why = reason;
  return false;
}

void AdasumAllreduce::exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                               int peer, TransferStats* ts) {
  // Both partners know both sizes (the ranges are a function of the level),
  // so skipping an empty side is agreed without a message.
  RequestList reqs;
  for (size_t off = 0; off < recv_bytes; off += kMaxPiece)
    comm_.irecv(static_cast<uint8_t*>(recv) + off, std::min(kMaxPiece, recv_bytes - off), peer,
                kTagAdasum, reqs);
  for (size_t off = 0; off < send_bytes; off += kMaxPiece)
    comm_.isend(static_cast<const uint8_t*>(send) + off, std::min(kMaxPiece, send_bytes - off),
                peer, kTagAdasum, reqs);
  if (reqs.size() > 0) comm_.wait_all(reqs, "adasum allreduce");
  ts->bytes_sent += send_bytes;
  ts->bytes_received += recv_bytes;
}

void AdasumAllreduce::group_sum(std::vector<double>& v, int group, TransferStats* ts) {
  const int me = comm_.rank();
  peer_sums_.resize(v.size());
  for (int j = 1; j < group; j <<= 1) {
    exchange(v.data(), v.size() * sizeof(double), peer_sums_.data(), v.size() * sizeof(double),
             me ^ j, ts);
    // lower block + upper block, whichever side this rank is on
    const bool lower = (me & j) == 0;
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = lower ? v[i] + peer_sums_[i] : peer_sums_[i] + v[i];
  }
}

template <typename T>
void AdasumAllreduce::run(T* buf, const std::vector<size_t>& counts, TransferStats* ts) {
  const int n = comm_.size(), me = comm_.rank();
  const size_t ntensors = counts.size();
  // Tensor t occupies [begin[t], begin[t+1]) of the buffer.
  std::vector<size_t> begin(ntensors + 1, 0);
  for (size_t t = 0; t < ntensors; ++t) begin[t + 1] = begin[t] + counts[t];
  const size_t total = begin[ntensors];
  std::vector<double> sums(3 * ntensors);
  struct Range {
    size_t lo, hi;
  };
  std::vector<Range> parents;  // the range held before each halving
  size_t lo = 0, hi = total;

  for (int d = 1; d < n; d <<= 1) {
    const int peer = me ^ d;
    const bool left = (me & d) == 0;
    const size_t mid = lo + (hi - lo) / 2;
    const Range keep = left ? Range{lo, mid} : Range{mid, hi};
    const Range give = left ? Range{mid, hi} : Range{lo, mid};
    parents.push_back({lo, hi});
    const size_t keep_n = keep.hi - keep.lo;
    recv_.resize(keep_n * sizeof(T));
    T* theirs = reinterpret_cast<T*>(recv_.data());
    T* mine = buf + keep.lo;
    exchange(buf + give.lo, (give.hi - give.lo) * sizeof(T), theirs, keep_n * sizeof(T), peer, ts);

    // Partial L.R, |L|^2, |R|^2 of every tensor over this rank's slice
    // (zero for tensors outside it); L is the left group's values.
    std::fill(sums.begin(), sums.end(), 0.0);
    // First tensor that ends after keep.lo (empty tensors are skipped).
    size_t first = static_cast<size_t>(
        std::upper_bound(begin.begin() + 1, begin.end(), keep.lo) - (begin.begin() + 1));
    for (size_t t = first; t < ntensors && begin[t] < keep.hi; ++t) {
      const size_t s = std::max(begin[t], keep.lo) - keep.lo;
      const size_t e = std::min(begin[t + 1], keep.hi) - keep.lo;
      double dot = 0.0, mm = 0.0, tt = 0.0;
      for (size_t i = s; i < e; ++i) {
        const double a = static_cast<double>(mine[i]), b = static_cast<double>(theirs[i]);
        dot += a * b;
        mm += a * a;
        tt += b * b;
      }
      sums[3 * t] = dot;
      sums[3 * t + 1] = left ? mm : tt;
      sums[3 * t + 2] = left ? tt : mm;
    }
    group_sum(sums, 2 * d, ts);

    for (size_t t = first; t < ntensors && begin[t] < keep.hi; ++t) {
      const size_t s = std::max(begin[t], keep.lo) - keep.lo;
      const size_t e = std::min(begin[t + 1], keep.hi) - keep.lo;
      const double cl = coefficient(sums[3 * t], sums[3 * t + 1]);
      const double cr = coefficient(sums[3 * t], sums[3 * t + 2]);
      const T* l = left ? mine : theirs;
      const T* r = left ? theirs : mine;
      for (size_t i = s; i < e; ++i)
        mine[i] = static_cast<T>(cl * static_cast<double>(l[i]) + cr * static_cast<double>(r[i]));
    }
    lo = keep.lo;
    hi = keep.hi;
  }

  for (int d = n >> 1; d >= 1; d >>= 1) {
    const Range parent = parents.back();
    parents.pop_back();
    const bool left = (me & d) == 0;
    const Range other = left ? Range{hi, parent.hi} : Range{parent.lo, lo};
    exchange(buf + lo, (hi - lo) * sizeof(T), buf + other.lo, (other.hi - other.lo) * sizeof(T),
             me ^ d, ts);
    lo = parent.lo;
    hi = parent.hi;
  }
}

void AdasumAllreduce::allreduce(void* buf, const std::vector<size_t>& counts, DataType dt,
                                TransferStats* ts) {
  std::string why;
  GF_CHECK(adasum_supported(dt, comm_.size(), &why), "gradflow: " << why);
  if (comm_.size() == 1) return;  // adasum of one operand is itself
  size_t total = 0;
  for (size_t c : counts) total += c;
  switch (dt) {
    case DataType::kFloat32:
      run(static_cast<float*>(buf), counts, ts);
      return;
    case DataType::kFloat64:
      run(static_cast<double*>(buf), counts, ts);
      return;
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      // Widen once, reduce in fp32 (no rounding to 16 bits between levels),
      // round once: every rank rounds the same fp32 values.
      const WireDtype w = dt == DataType::kFloat16 ? WireDtype::kFloat16 : WireDtype::kBFloat16;
      auto* h = static_cast<uint16_t*>(buf);
      widened_.resize(total);
      decode_f32(w, h, widened_.data(), total);
      run(widened_.data(), counts, ts);
      encode_f32(w, widened_.data(), h, total);
      return;
    }
    default:
      break;
  }
  GF_CHECK(false, "gradflow: Adasum of " << dtype_name(dt) << " is not supported");
}

}  // namespace gradflow
