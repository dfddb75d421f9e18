// recursive_doubling_allreduce.cc — the latency-optimal allreduce for small
// messages (the "recursive-doubling" algorithm; `auto` picks it for small
// messages between hosts). Sees only MpiComm point-to-point, the wire codec
// and the reduce kernels; never configuration or the runtime.
//
// Why it exists
// -------------
// A ring allreduce of a few KiB costs 2(N-1) sequential hops, each a network
// round of latency and, with more ranks than cores, a scheduler wake-up of
// the receiving rank. CSC's importance vector and its packed chunks are such
// messages, several per step (docs/performance.md, issue 16 target 1).
// Recursive doubling needs ceil(log2 N) exchanges; each rank sends the whole
// buffer every time, so it only pays while latency dominates bytes.
//
// The algorithm (as in MPICH's MPIR_Allreduce_intra_recursive_doubling)
// ------------------------------------------------------------------------
// p2 = the largest power of two <= N, rem = N - p2.
//   Fold: among ranks 0 .. 2*rem-1, even rank r sends its buffer to r+1,
//         which reduces it in and stands for both; r sits out.
//   Doubling: the p2 remaining ranks, renumbered 0 .. p2-1, exchange whole
//         buffers with partner (new rank XOR mask) for mask = 1, 2, 4, ...
//         and both reduce; after log2(p2) rounds everyone holds the total.
//   Unfold: odd rank r < 2*rem sends the result back to r-1.
//
// Bitwise identity (Note [Canonical operand order])
// -------------------------------------------------
// The two partners of an exchange compute the same reduction, but each holds
// its own operand in its buffer and the other's in the receive buffer. Both
// call reduce_into(lower rank's data, higher rank's data): the lower rank in
// place, the higher rank into the receive buffer and then copies it back.
// The same kernel with the same operands in the same roles gives the same
// bytes, so every rank ends bitwise identical without relying on the op
// being commutative (NaN payloads, for one, are not).
//
// Wire format (Note [16-bit wire] in ring_allreduce.cc). For float32
// sum/average with a 16-bit wire, a rank rounds its own partial to the wire
// (x = decode(encode(x))) before each exchange and sends encode(x); both
// partners then add the same two fp32 values. The final sum is rounded once
// more, so the result is what the wire can carry, as in the ring and
// two-sync, and the unfold sends those 16-bit bytes.
//
// Messages over 1 GiB travel in pieces (MPI counts are ints); all pieces of
// one exchange are posted at once on kTagRecursiveDoubling, and MPI matches
// messages between one pair in order.
#include "recursive_doubling_allreduce.h"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.h"
#include "wire_codec.h"

namespace gradflow {

namespace {

constexpr size_t kMaxMessageBytes = size_t{1} << 30;

class RecursiveDoubling {
 public:
  RecursiveDoubling(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                    WireDtype wire, std::vector<uint8_t>& scratch, TransferStats* stats)
      : comm_(comm), n_(comm.size()), r_(comm.rank()), buf_(static_cast<uint8_t*>(buf)),
        count_(count), dt_(dt), op_(op), es_(dtype_size(dt)), stats_(stats) {
    std::string why;
    GF_CHECK(reduce_supported(dt, op, &why), "gradflow: recursive-doubling allreduce: " << why);
    wire_ = wire != WireDtype::kNative && dt == DataType::kFloat32 &&
            (op == ReduceOp::kSum || op == ReduceOp::kAverage);
    wdt_ = wire;
    // Scratch: [what goes out (16-bit image; wire only)][what comes in][the
    // other operand as fp32 (wire) / unused (native)].
    const size_t out16 = wire_ ? align64(count * 2) : 0;
    const size_t in = align64(count * (wire_ ? 2 : es_));
    const size_t other = wire_ ? align64(count * 4) : 0;
    if (scratch.size() < out16 + in + other) scratch.resize(out16 + in + other);
    out16_ = scratch.data();
    in_ = scratch.data() + out16;
    other_ = in_ + in;
  }

  void run() {
    int p2 = 1;
    while (p2 * 2 <= n_) p2 *= 2;
    const int rem = n_ - p2;
    if (r_ < 2 * rem && r_ % 2 == 0) {
      // Folded out: hand the buffer to r+1, get the result back.
      if (wire_) round_to_wire();
      send(r_ + 1);
      // Before the result may land in the buffer the send reads from.
      comm_.wait_all(sends_, "recursive-doubling allreduce");
      recv_result(r_ + 1);
      return;
    }
    if (r_ < 2 * rem) exchange_and_reduce(r_ - 1, /*send_mine=*/false);
    const int me = r_ < 2 * rem ? r_ / 2 : r_ - rem;
    for (int mask = 1; mask < p2; mask <<= 1) {
      const int peer = me ^ mask;
      exchange_and_reduce(peer < rem ? peer * 2 + 1 : peer + rem, /*send_mine=*/true);
    }
    if (wire_) round_to_wire();  // the result carries wire precision, as in the ring
    if (r_ < 2 * rem) send(r_ - 1);
    comm_.wait_all(sends_, "recursive-doubling allreduce");
  }

 private:
  size_t wire_bytes() const { return count_ * (wire_ ? 2 : es_); }
  // What travels: the 16-bit image on the wire path, else the buffer itself.
  uint8_t* outgoing() { return wire_ ? out16_ : buf_; }

  void post(uint8_t* data, int peer, bool is_send, RequestList& reqs) {
    const size_t total = wire_bytes();
    for (size_t off = 0; off < total; off += kMaxMessageBytes) {
      const size_t len = std::min(kMaxMessageBytes, total - off);
      if (is_send) {
        comm_.isend(data + off, len, peer, kTagRecursiveDoubling, reqs);
        stats_->bytes_sent += len;
      } else {
        comm_.irecv(data + off, len, peer, kTagRecursiveDoubling, reqs);
        stats_->bytes_received += len;
      }
    }
  }

  void send(int peer) { post(outgoing(), peer, /*is_send=*/true, sends_); }

  // x = decode(encode(x)) in place, keeping encode(x) as what goes out.
  void round_to_wire() {
    timed_codec(stats_, [&] {
      float* f = reinterpret_cast<float*>(buf_);
      uint16_t* h = reinterpret_cast<uint16_t*>(out16_);
      if (encode_f32(wdt_, f, h, count_)) stats_->wire_overflow = true;
      decode_f32(wdt_, h, f, count_);
    });
  }

  // One exchange with `peer` (send_mine = false: receive only, in the fold),
  // then buffer = reduce(lower rank's operand, higher rank's operand).
  void exchange_and_reduce(int peer, bool send_mine) {
    if (wire_) round_to_wire();
    RequestList reqs;
    post(in_, peer, /*is_send=*/false, reqs);
    if (send_mine) post(outgoing(), peer, /*is_send=*/true, reqs);
    comm_.wait_all(reqs, "recursive-doubling allreduce");
    // The received operand, in the buffer's dtype.
    uint8_t* theirs = in_;
    if (wire_) {
      decode_incoming(other_);
      theirs = other_;
    }
    if (r_ < peer) {
      reduce_into(buf_, theirs, count_, dt_, op_);
    } else {
      reduce_into(theirs, buf_, count_, dt_, op_);
      std::memcpy(buf_, theirs, count_ * es_);
    }
  }

  // The folded-out rank receives the final result.
  void recv_result(int peer) {
    RequestList reqs;
    post(wire_ ? in_ : buf_, peer, /*is_send=*/false, reqs);
    comm_.wait_all(reqs, "recursive-doubling allreduce");
    if (wire_) decode_incoming(buf_);
  }

  // Wire path: the peer's 16-bit bytes (in_) as fp32 into `dst`.
  void decode_incoming(uint8_t* dst) {
    timed_codec(stats_, [&] {
      decode_f32(wdt_, reinterpret_cast<const uint16_t*>(in_), reinterpret_cast<float*>(dst),
                 count_);
    });
  }

  MpiComm& comm_;
  const int n_, r_;
  uint8_t* buf_;
  const size_t count_;
  const DataType dt_;
  const ReduceOp op_;
  const size_t es_;  // element size in the buffer
  TransferStats* stats_;
  bool wire_ = false;  // 16-bit wire in use
  WireDtype wdt_ = WireDtype::kNative;
  uint8_t* out16_ = nullptr;  // wire path: encode(buffer)
  uint8_t* in_ = nullptr;     // the peer's bytes as they arrive
  uint8_t* other_ = nullptr;  // wire path: the peer's operand decoded to fp32
  RequestList sends_;         // fold/unfold sends, completed before returning
};

}  // namespace

void recursive_doubling_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                                  WireDtype wire, std::vector<uint8_t>& scratch,
                                  TransferStats* stats) {
  timed_transfer(stats, [&](TransferStats* st) {
    if (comm.size() > 1 && count > 0)
      RecursiveDoubling(comm, buf, count, dt, op, wire, scratch, st).run();
  });
}

}  // namespace gradflow
