// halving_doubling_allreduce.cc — Rabenseifner's allreduce (the
// "halving-doubling" algorithm): a reduce-scatter by recursive halving, then
// an allgather by recursive doubling. Sees only MpiComm point-to-point, the
// wire codec and the reduce kernels; never configuration or the runtime.
//
// Why it exists
// -------------
// The ring moves the fewest bytes but needs 2(N-1) dependent hops; with
// more ranks than cores every hop also waits for the receiving rank to get
// a core. At 4 ranks on 2 cores a 1 MiB ring ran at 0.51–0.86x the speed
// of MPICH's MPI_Allreduce, which uses this algorithm for such sizes
// (issue 16 target 6). Halving-doubling moves the ring's bytes for a power
// of two in 2·log2 N exchanges: 4 instead of 6 at N = 4, 6 instead of 14 at
// N = 8. Measured (docs/performance.md, "Target 6: MPI's own algorithm"):
// no faster than the ring at 4 ranks here, on one node or across 4 hosts;
// faster at 8 hosts for 16–64 KiB. So it is an explicit choice; `auto`
// does not take it.
//
// The algorithm (as in MPICH's MPIR_Allreduce_intra_reduce_scatter_allgather)
// ---------------------------------------------------------------------------
// p2 = the largest power of two <= N, rem = N - p2.
//   Fold: among ranks 0 .. 2*rem-1, even rank r sends its buffer to r+1,
//         which reduces it in and stands for both; r sits out. The others
//         are renumbered 0 .. p2-1 ("me"), as in recursive doubling.
//   Reduce-scatter: the buffer is cut into p2 balanced blocks. For mask =
//         p2/2, p2/4, ..., 1 a rank exchanges with me XOR mask: of the
//         blocks it still covers, it sends the half its partner keeps and
//         reduces the other half's arriving data into its own. The bit of
//         `me` picks the half, so afterwards rank `me` holds block `me`,
//         reduced over all ranks, and nobody else computed it.
//   Allgather: for mask = 1, 2, ..., p2/2 partners swap the runs of blocks
//         they hold; the run doubles each time.
//   Unfold: odd rank r < 2*rem sends the result to r-1.
//
// Bitwise identity. Each block is reduced on exactly one rank and then only
// copied, so every rank ends with the same bytes whatever the op's
// commutativity (no canonical operand order needed, unlike recursive
// doubling).
//
// Wire format (Note [16-bit wire] in ring_allreduce.cc). For float32
// sum/average with a 16-bit wire, what a rank sends in the fold and the
// reduce-scatter is encode(its fp32 partial); the receiver adds decode() of
// it in fp32. The owner of a reduced block rounds it once
// (x = decode(encode(x))) and the allgather and unfold forward those 16-bit
// bytes unchanged: the result is what the wire can carry, as in the ring.
//
// Pipelining. Each exchange moves in pieces of at most `piece_bytes`; all
// receives and sends of an exchange are posted before any wait, and the
// reduce-scatter reduces piece j while piece j+1 is still arriving.
//
// Note [Early allgather receive]. The last reduce-scatter exchange and the
// first allgather exchange have the same partner (mask 1). That partner may
// finish its reduce-scatter and send its block while we still wait for our
// reduce-scatter sends to complete: the pattern that stalled MPICH over
// libfabric's tcp provider in the ring (Note [Receives before send waits]
// in ring_allreduce.cc). So the first allgather exchange's receive is posted
// together with the last reduce-scatter exchange. It lands in a staging
// area, not in place: in place is the range our reduce-scatter send is
// still reading. As in the ring, only between nodes: shared memory never
// showed the stall, and the staging copy costs time there. The folded-out
// ranks always post the receive of the result before waiting for their own
// send (into scratch, then one copy into place).
//
// Messages over 1 GiB are split into pieces (MPI counts are ints); all
// traffic is on kTagHalvingDoubling, and MPI matches messages between one
// pair in order, so both sides agree on every piece's size.
#include "halving_doubling_allreduce.h"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.h"
#include "wire_codec.h"

namespace gradflow {

namespace {

constexpr size_t kMaxMessageBytes = size_t{1} << 30;
constexpr const char* kWhat = "halving-doubling allreduce";

class HalvingDoubling {
 public:
  HalvingDoubling(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                  WireDtype wire, size_t piece_bytes, std::vector<uint8_t>& scratch,
                  TransferStats* stats)
      : comm_(comm), n_(comm.size()), r_(comm.rank()), buf_(static_cast<uint8_t*>(buf)),
        count_(count), dt_(dt), op_(op), es_(dtype_size(dt)), stats_(stats) {
    std::string why;
    GF_CHECK(reduce_supported(dt, op, &why), "gradflow: halving-doubling allreduce: " << why);
    wire_ = wire != WireDtype::kNative && dt == DataType::kFloat32 &&
            (op == ReduceOp::kSum || op == ReduceOp::kAverage);
    wdt_ = wire;
    ws_ = wire_ ? 2 : es_;
    piece_elems_ = std::max<size_t>(1, std::min(piece_bytes, kMaxMessageBytes) / ws_);
    p2_ = 1;
    while (p2_ * 2 <= n_) p2_ *= 2;
    rem_ = n_ - p2_;
    // Scratch: [what arrives: the whole buffer (fold, result of a
    // folded-out rank) or half of it (reduce-scatter), in wire elements]
    // [16-bit image of the whole buffer (wire only): what the fold, the
    // reduce-scatter and the allgather send][staging for the first
    // allgather receive (Note [Early allgather receive])].
    const size_t in = align64(count * ws_);
    const size_t shadow = wire_ ? align64(count * 2) : 0;
    const size_t stage = align64((count / p2_ + 1) * ws_);
    if (scratch.size() < in + shadow + stage) scratch.resize(in + shadow + stage);
    in_ = scratch.data();
    shadow_ = in_ + in;
    stage_ = shadow_ + shadow;
  }

  void run() {
    if (r_ < 2 * rem_ && r_ % 2 == 0) {
      fold_out();
      return;
    }
    if (r_ < 2 * rem_) fold_in(r_ - 1);
    me_ = r_ < 2 * rem_ ? r_ / 2 : r_ - rem_;
    reduce_scatter();
    allgather();
    if (r_ < 2 * rem_) {
      RequestList reqs;
      post(wire_ ? shadow_ : buf_, count_, r_ - 1, /*is_send=*/true, reqs);
      comm_.wait_all(reqs, kWhat);
    }
  }

 private:
  // Element offset of block b of p2 balanced blocks.
  size_t block_offset(int b) const {
    const size_t base = count_ / p2_, extra = count_ % p2_;
    return b * base + std::min<size_t>(b, extra);
  }
  size_t range_elems(int first_block, int blocks) const {
    return block_offset(first_block + blocks) - block_offset(first_block);
  }
  int real_rank(int new_rank) const { return new_rank < rem_ ? new_rank * 2 + 1 : new_rank + rem_; }
  // What travels for elements starting at `elem`: the 16-bit image on the
  // wire path, else the buffer itself.
  uint8_t* outgoing(size_t elem) { return wire_ ? shadow_ + elem * 2 : buf_ + elem * es_; }

  // Posts `elems` wire elements at `data` to/from `peer` in pieces; returns
  // the number of requests posted.
  size_t post(uint8_t* data, size_t elems, int peer, bool is_send, RequestList& reqs) {
    size_t posted = 0;
    for (size_t off = 0; off < elems; off += piece_elems_, ++posted) {
      const size_t len = std::min(piece_elems_, elems - off) * ws_;
      if (is_send) {
        comm_.isend(data + off * ws_, len, peer, kTagHalvingDoubling, reqs);
        stats_->bytes_sent += len;
      } else {
        comm_.irecv(data + off * ws_, len, peer, kTagHalvingDoubling, reqs);
        stats_->bytes_received += len;
      }
    }
    return posted;
  }

  void encode(size_t elem, size_t n) {
    timed_codec(stats_, [&] {
      if (encode_f32(wdt_, reinterpret_cast<const float*>(buf_) + elem,
                     reinterpret_cast<uint16_t*>(shadow_) + elem, n))
        stats_->wire_overflow = true;
    });
  }
  void decode(const uint8_t* from, size_t elem, size_t n) {
    timed_codec(stats_, [&] {
      decode_f32(wdt_, reinterpret_cast<const uint16_t*>(from),
                 reinterpret_cast<float*>(buf_) + elem, n);
    });
  }
  // buf[elem .. elem+n) (op)= the n arriving elements at `from`.
  void accumulate(const uint8_t* from, size_t elem, size_t n) {
    if (!wire_) {
      reduce_into(buf_ + elem * es_, from, n, dt_, op_);
      return;
    }
    timed_codec(stats_, [&] {
      decode_accumulate_f32(wdt_, reinterpret_cast<const uint16_t*>(from),
                            reinterpret_cast<float*>(buf_) + elem, n);
    });
  }

  // Even rank r < 2*rem: hand the buffer to r+1, receive the result.
  void fold_out() {
    if (wire_) encode(0, count_);
    RequestList reqs;
    post(in_, count_, r_ + 1, /*is_send=*/false, reqs);  // the result, posted first
    post(outgoing(0), count_, r_ + 1, /*is_send=*/true, reqs);
    comm_.wait_all(reqs, kWhat);
    if (wire_) decode(in_, 0, count_);
    else std::memcpy(buf_, in_, count_ * es_);
  }

  // Odd rank r < 2*rem: reduce the buffer of r-1 into ours, piece by piece.
  void fold_in(int peer) {
    RequestList reqs;
    const size_t pieces = post(in_, count_, peer, /*is_send=*/false, reqs);
    reduce_arrivals(reqs, pieces, 0, count_);
    comm_.wait_all(reqs, kWhat);
  }

  // Waits for the `pieces` receives at the front of `reqs` (landed in in_)
  // and reduces each into buf[elem ...] as it arrives.
  void reduce_arrivals(RequestList& reqs, size_t pieces, size_t elem, size_t elems) {
    for (size_t j = 0; j < pieces; ++j) {
      comm_.wait(reqs, j, kWhat);
      const size_t off = j * piece_elems_;
      accumulate(in_ + off * ws_, elem + off, std::min(piece_elems_, elems - off));
    }
  }

  void reduce_scatter() {
    int lo = 0, blocks = p2_;  // the run of blocks this rank still covers
    for (int mask = p2_ / 2; mask >= 1; mask /= 2) {
      const int half = blocks / 2;
      const bool keep_upper = (me_ & mask) != 0;
      const int keep_lo = keep_upper ? lo + half : lo, send_lo = keep_upper ? lo : lo + half;
      const size_t keep_at = block_offset(keep_lo), keep_n = range_elems(keep_lo, half);
      const size_t send_at = block_offset(send_lo), send_n = range_elems(send_lo, half);
      const int peer = real_rank(me_ ^ mask);
      RequestList reqs;
      const size_t pieces = post(in_, keep_n, peer, /*is_send=*/false, reqs);
      if (mask == 1 && !comm_.all_on_one_node()) post_first_allgather_receive(peer);
      if (wire_) encode(send_at, send_n);
      post(outgoing(send_at), send_n, peer, /*is_send=*/true, reqs);
      reduce_arrivals(reqs, pieces, keep_at, keep_n);
      comm_.wait_all(reqs, kWhat);
      lo = keep_lo;
      blocks = half;
    }
  }

  // Note [Early allgather receive]: the partner's block, into the staging
  // area. Its own request list: the reduce-scatter step must not wait for it
  // (the partner sends it only after that step).
  void post_first_allgather_receive(int peer) {
    const int theirs = me_ ^ 1;
    post(stage_, range_elems(theirs, 1), peer, /*is_send=*/false, early_reqs_);
    early_ = true;
  }

  void allgather() {
    // The owner's block, rounded once to what the wire carries.
    const size_t mine_at = block_offset(me_), mine_n = range_elems(me_, 1);
    if (wire_) {
      encode(mine_at, mine_n);
      decode(shadow_ + mine_at * 2, mine_at, mine_n);
    }
    int lo = me_, blocks = 1;
    for (int mask = 1; mask < p2_; mask *= 2) {
      const int their_lo = lo ^ mask;  // runs are aligned to their length
      const size_t at = block_offset(lo), n = range_elems(lo, blocks);
      const size_t their_at = block_offset(their_lo), their_n = range_elems(their_lo, blocks);
      const int peer = real_rank(me_ ^ mask);
      RequestList reqs;
      if (!(mask == 1 && early_)) post(outgoing(their_at), their_n, peer, /*is_send=*/false, reqs);
      post(outgoing(at), n, peer, /*is_send=*/true, reqs);
      comm_.wait_all(reqs, kWhat);
      if (mask == 1 && early_) {
        // Staged: into place (the reduce-scatter send that read this range
        // completed before the allgather began).
        comm_.wait_all(early_reqs_, kWhat);
        std::memcpy(outgoing(their_at), stage_, their_n * ws_);
      }
      if (wire_) decode(shadow_ + their_at * 2, their_at, their_n);
      lo = std::min(lo, their_lo);
      blocks *= 2;
    }
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
  size_t ws_ = 0;           // element size on the wire
  size_t piece_elems_ = 1;  // wire elements per message
  int p2_ = 1, rem_ = 0, me_ = 0;
  bool early_ = false;          // the first allgather receive went to stage_
  RequestList early_reqs_;      // ... and is waited for in the allgather
  uint8_t* in_ = nullptr;       // arriving data (wire elements)
  uint8_t* shadow_ = nullptr;   // wire path: 16-bit image of the buffer
  uint8_t* stage_ = nullptr;    // the first allgather receive
};

}  // namespace

void halving_doubling_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                                WireDtype wire, size_t piece_bytes, std::vector<uint8_t>& scratch,
                                TransferStats* stats) {
  timed_transfer(stats, [&](TransferStats* st) {
    if (comm.size() > 1 && count > 0)
      HalvingDoubling(comm, buf, count, dt, op, wire, piece_bytes, scratch, st).run();
  });
}

}  // namespace gradflow
