// ring_allreduce.cc — the segmented, pipelined ring allreduce and the ring
// reduce-scatter it is built from. Sees only MpiComm point-to-point, the wire
// codec and the reduce kernels; never configuration or the runtime.
//
// The algorithm
// -------------
// N ranks form a ring: rank r sends to right = r+1 and receives from
// left = r-1 (mod N). The buffer is cut into N segments; segment k is owned
// by rank k. Segments are balanced: count/N elements each, the remainder
// spread one element each over the first segments.
//
//   Phase 1, reduce-scatter (N-1 steps). At step s rank r sends segment
//   (r-1-s) to the right and receives segment (r-2-s) from the left, reducing
//   it into its own copy. What rank r receives at step s is what it sends at
//   step s+1, so after N-1 steps segment r holds the reduction over all ranks
//   on its owner, rank r.
//   Phase 2, allgather (N-1 steps). At step s rank r sends segment (r-s) and
//   receives segment (r-1-s), storing it; what it receives is what it
//   forwards at step s+1.
//
// Pipelining. Each segment moves in pieces of at most opt.pipeline_bytes.
// Receives for a step are posted as whole-segment batches; as soon as piece j
// of a step has arrived and been reduced, it is sent onward as piece j of the
// next step. So piece j+1 is on the wire while piece j is being reduced, and
// step s+1 starts before step s has finished. The owner's last reduced piece
// goes out straight away as allgather step 0: the phases also overlap.
//
// Cost. 2(N-1) steps; each rank sends and receives 2(N-1)/N of the buffer,
// independent of N (bandwidth-optimal). Latency: 2(N-1) hops plus one piece
// of pipeline fill per hop.
//
// Wire format (Note [16-bit wire]). For float32 sum/average with opt.wire =
// fp16/bf16 the data travels as 16-bit: each hop decodes the arriving piece
// and accumulates it in fp32 (one rounding per hop when it is re-encoded to
// go on); the owner of a fully reduced segment rounds it once to 16-bit,
// overwrites its own fp32 values with decode(encode(x)), and the allgather
// forwards those 16-bit bytes unchanged, so every rank ends bitwise
// identical. A 16-bit shadow of the whole buffer holds what is on the wire.
//
// Message order. All traffic is left -> right on kTagRing; MPI matches
// messages between one pair in order, and both sides enumerate (step, piece)
// in the same order, so piece sizes always agree.
//
// Note [Receives before send waits]. With two ranks, left and right are the
// same peer, and that peer sends us its allgather pieces while it is still
// receiving our reduce-scatter pieces. If those allgather pieces find no
// posted receive, they wait in the transport as unexpected messages; MPICH
// over libfabric's tcp provider (the netmod of benchmarks/cluster) then
// stopped completing our reduce-scatter sends: the peer had received every
// byte, yet our wait_all(rs_sends_) and its wait_all(ag_sends_) both timed
// out. Seen 6 times in 98 loaded runs of a 64 MiB, 256 KiB-piece ring
// between two emulated hosts, and in none of 40 with the receives posted
// first (docs/performance.md, "The two-rank ring deadlock"). So at two ranks the
// allgather receives are posted together with the reduce-scatter receives,
// before any wait on our sends. They cannot land in place while a send may
// still read that memory (MPI forbids writing a pending send's buffer), so
// they land in the spare receive buffer and are copied (or decoded) into
// place once the reduce-scatter sends are complete. The out-of-place path
// sent segment r-1 from the input, so there they land in place directly.
// With three or more ranks the peer we wait on for send completion (right)
// never sends us data, so the order there is unchanged. Two ranks on one node
// talk through shared memory, which never showed the stall, and there the
// early receives cost up to +40 % at 64 MiB (the staging copy, and the
// allgather competing with the reduce-scatter for memory bandwidth;
// docs/performance.md): so only a ring across nodes posts them early. (A
// one-node job forced onto the network, MPIR_CVAR_NOLOCAL=1, is not
// covered.) The rule for every algorithm: before waiting on sends to a peer,
// post the receives for all that peer may send meanwhile (recursive
// doubling, Adasum and the data collectives post all receives of an
// exchange before any wait).
#include "ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.h"
#include "wire_codec.h"

namespace gradflow {

namespace {

// State of one ring collective: the buffer, its segments, the wire format
// and the staging memory (all carved out of the caller's scratch).
class Ring {
 public:
  Ring(MpiComm& comm, void* buf, const std::vector<size_t>& seg_counts, DataType dt, ReduceOp op,
       const RingOptions& opt, std::vector<uint8_t>& scratch, TransferStats* stats)
      : comm_(comm), n_(comm.size()), r_(comm.rank()), buf_(static_cast<uint8_t*>(buf)),
        dt_(dt), op_(op), es_(dtype_size(dt)), stats_(stats) {
    std::string why;
    GF_CHECK(reduce_supported(dt, op, &why), "gradflow: ring allreduce: " << why);
    cnt_ = seg_counts;
    off_.assign(n_, 0);
    for (int k = 1; k < n_; ++k) off_[k] = off_[k - 1] + cnt_[k - 1];
    size_t total = off_[n_ - 1] + cnt_[n_ - 1];
    wire_ = opt.wire != WireDtype::kNative && dt == DataType::kFloat32 &&
            (op == ReduceOp::kSum || op == ReduceOp::kAverage);
    wdt_ = opt.wire;
    ws_ = wire_ ? 2 : es_;
    // Pieces: at least one element, at most 1 GiB (an int count for MPI).
    piece_ = std::max<size_t>(1, std::min(opt.pipeline_bytes, size_t{1} << 30) / ws_);
    // Scratch: [16-bit shadow of the buffer][receive buffer A][receive buffer B].
    size_t max_seg = *std::max_element(cnt_.begin(), cnt_.end());
    size_t shadow = wire_ ? align64(total * 2) : 0;
    size_t rbytes = align64(max_seg * ws_);
    if (scratch.size() < shadow + 2 * rbytes) scratch.resize(shadow + 2 * rbytes);
    shadow_ = scratch.data();
    rbuf_[0] = scratch.data() + shadow;
    rbuf_[1] = rbuf_[0] + rbytes;
    // Note [Out-of-place ring]: on rank r every segment but r-1 is reduced
    // exactly once (reduce-scatter step s reduces segment r-2-s), and segment
    // r-1 is sent once at step 0 and then arrives whole in the allgather. So
    // reading the input only at those two places and writing each reduced or
    // received segment into the buffer gives the in-place result without a
    // copy pass. The 16-bit wire accumulates in its shadow: it copies first.
    src_ = static_cast<const uint8_t*>(opt.input);
    if (src_ && wire_) {
      std::memcpy(buf_, src_, total * es_);
      src_ = nullptr;
    }
  }

  // Phase 1. With `then_allgather`, the owner finalizes its segment piece by
  // piece (16-bit rounding on the wire path) and starts allgather step 0.
  void reduce_scatter(bool then_allgather) {
    const int first = mod(r_ - 1);
    // Step 0: push segment r-1 whole, piece by piece.
    for (size_t j = 0; j < pieces(first); ++j) {
      if (wire_) encode_piece(first, j);
      if (src_) {  // out of place: straight from the input
        const size_t bytes = piece_len(first, j) * es_;
        comm_.isend(src_ + elem(first, j) * es_, bytes, right(), kTagRing, rs_sends_);
        stats_->bytes_sent += bytes;
      } else {
        send_piece(first, j, rs_sends_);
      }
    }
    RequestList recvs[2];
    post_recvs_rs(0, recvs[0]);
    if (then_allgather && n_ == 2 && !comm_.all_on_one_node()) post_early_allgather_recvs();
    for (int s = 0; s < n_ - 1; ++s) {
      const int k = mod(r_ - 2 - s);  // the segment arriving at this step
      const bool last = s == n_ - 2;  // k == r: we are its owner
      if (!last) post_recvs_rs(s + 1, recvs[(s + 1) % 2]);
      const uint8_t* in = rbuf_[s % 2];
      for (size_t j = 0; j < pieces(k); ++j) {
        comm_.wait(recvs[s % 2], j, "ring reduce-scatter");
        reduce_piece(k, j, in + j * piece_ * ws_);
        if (!last) {  // k-2 steps: reduce and send on
          if (wire_) encode_piece(k, j);
          send_piece(k, j, rs_sends_);
        } else if (then_allgather) {  // owner: finalize and start the allgather
          if (wire_) {
            encode_piece(k, j);
            decode_piece(k, j);  // own values = decode(encode(x)), as every peer will see
          }
          send_piece(k, j, ag_sends_);
        }
      }
      recvs[s % 2].clear();
    }
    comm_.wait_all(rs_sends_, "ring reduce-scatter");
  }

  // Phase 2. Receives land directly in their final place (the buffer, or the
  // 16-bit shadow on the wire path): segments are distinct per step, so all
  // steps are posted at once. Reduce-scatter sends were completed first since
  // they read the memory these receives overwrite.
  void allgather() {
    if (early_ag_) {
      finish_early_allgather();
      return;
    }
    RequestList recvs;
    for (int s = 0; s < n_ - 1; ++s) {
      const int k = mod(r_ - 1 - s);
      for (size_t j = 0; j < pieces(k); ++j) {
        comm_.irecv(wire_at(k, j), piece_len(k, j) * ws_, left(), kTagRing, recvs);
        stats_->bytes_received += piece_len(k, j) * ws_;
      }
    }
    size_t idx = 0;
    for (int s = 0; s < n_ - 1; ++s) {
      const int k = mod(r_ - 1 - s);
      for (size_t j = 0; j < pieces(k); ++j, ++idx) {
        comm_.wait(recvs, idx, "ring allgather");
        if (s < n_ - 2) send_piece(k, j, ag_sends_);  // forward the bytes unchanged
        if (wire_) decode_piece(k, j);
      }
    }
    comm_.wait_all(ag_sends_, "ring allgather");
  }

 private:
  int mod(int k) const { return ((k % n_) + n_) % n_; }
  int left() const { return mod(r_ - 1); }
  int right() const { return mod(r_ + 1); }
  size_t pieces(int k) const { return (cnt_[k] + piece_ - 1) / piece_; }
  size_t piece_len(int k, size_t j) const { return std::min(piece_, cnt_[k] - j * piece_); }
  size_t elem(int k, size_t j) const { return off_[k] + j * piece_; }
  uint8_t* buf_at(int k, size_t j) { return buf_ + elem(k, j) * es_; }
  // Where the bytes that travel for (segment k, piece j) live.
  uint8_t* wire_at(int k, size_t j) {
    return wire_ ? shadow_ + elem(k, j) * 2 : buf_at(k, j);
  }

  void send_piece(int k, size_t j, RequestList& sends) {
    size_t bytes = piece_len(k, j) * ws_;
    comm_.isend(wire_at(k, j), bytes, right(), kTagRing, sends);
    stats_->bytes_sent += bytes;
  }

  // Note [Receives before send waits]: two ranks, allgather step 0 receives
  // segment r-1, posted before reduce-scatter waits on its sends. Staged in
  // receive buffer 1 (reduce-scatter at two ranks only uses buffer 0) unless
  // the out-of-place dense path left that part of the buffer unsent.
  void post_early_allgather_recvs() {
    const int k = mod(r_ - 1);
    ag_stage_ = (src_ && !wire_) ? nullptr : rbuf_[1];
    for (size_t j = 0; j < pieces(k); ++j) {
      const size_t bytes = piece_len(k, j) * ws_;
      uint8_t* dst = ag_stage_ ? ag_stage_ + j * piece_ * ws_ : buf_at(k, j);
      comm_.irecv(dst, bytes, left(), kTagRing, ag_recvs_);
      stats_->bytes_received += bytes;
    }
    early_ag_ = true;
  }

  // The reduce-scatter sends are complete here (reduce_scatter waited for
  // them), so the staged pieces may now overwrite what they read.
  void finish_early_allgather() {
    const int k = mod(r_ - 1);
    for (size_t j = 0; j < pieces(k); ++j) {
      comm_.wait(ag_recvs_, j, "ring allgather");
      if (!ag_stage_) continue;  // landed in place
      const uint8_t* staged = ag_stage_ + j * piece_ * ws_;
      if (wire_)
        decode_piece(k, j, staged);
      else
        std::memcpy(buf_at(k, j), staged, piece_len(k, j) * es_);
    }
    ag_recvs_.clear();
    comm_.wait_all(ag_sends_, "ring allgather");
  }

  // Receives of reduce-scatter step s (segment r-2-s) into receive buffer s%2.
  void post_recvs_rs(int s, RequestList& recvs) {
    const int k = mod(r_ - 2 - s);
    for (size_t j = 0; j < pieces(k); ++j) {
      size_t bytes = piece_len(k, j) * ws_;
      comm_.irecv(rbuf_[s % 2] + j * piece_ * ws_, bytes, left(), kTagRing, recvs);
      stats_->bytes_received += bytes;
    }
  }

  void reduce_piece(int k, size_t j, const uint8_t* in) {
    if (!wire_) {
      if (src_)
        reduce_into_from(buf_at(k, j), src_ + elem(k, j) * es_, in, piece_len(k, j), dt_, op_);
      else
        reduce_into(buf_at(k, j), in, piece_len(k, j), dt_, op_);
      return;
    }
    timed_codec(stats_, [&] {
      decode_accumulate_f32(wdt_, reinterpret_cast<const uint16_t*>(in),
                            reinterpret_cast<float*>(buf_at(k, j)), piece_len(k, j));
    });
  }

  void encode_piece(int k, size_t j) {
    timed_codec(stats_, [&] {
      if (encode_f32(wdt_, reinterpret_cast<const float*>(buf_at(k, j)),
                     reinterpret_cast<uint16_t*>(wire_at(k, j)), piece_len(k, j)))
        stats_->wire_overflow = true;
    });
  }

  // Decodes the 16-bit image of (segment k, piece j) into the buffer: from
  // where it travels (wire_at), or from `from` (a staged copy).
  void decode_piece(int k, size_t j, const uint8_t* from = nullptr) {
    timed_codec(stats_, [&] {
      decode_f32(wdt_, reinterpret_cast<const uint16_t*>(from ? from : wire_at(k, j)),
                 reinterpret_cast<float*>(buf_at(k, j)), piece_len(k, j));
    });
  }

  MpiComm& comm_;
  const int n_, r_;
  uint8_t* buf_;
  const DataType dt_;
  const ReduceOp op_;
  const size_t es_;          // element size in the buffer
  TransferStats* stats_;
  std::vector<size_t> cnt_, off_;  // per segment, in elements
  bool wire_ = false;        // 16-bit wire in use
  WireDtype wdt_ = WireDtype::kNative;
  size_t ws_ = 0;            // element size on the wire
  size_t piece_ = 1;         // elements per piece
  uint8_t* shadow_ = nullptr;  // wire path: 16-bit image of the buffer
  uint8_t* rbuf_[2] = {nullptr, nullptr};  // reduce-scatter receive buffers
  const uint8_t* src_ = nullptr;  // out of place: the input (Note [Out-of-place ring])
  RequestList rs_sends_, ag_sends_;
  // Note [Receives before send waits] (two ranks only).
  bool early_ag_ = false;
  RequestList ag_recvs_;
  uint8_t* ag_stage_ = nullptr;  // staging for ag_recvs_, or null: in place
};

std::vector<size_t> balanced_segments(size_t count, int n) {
  std::vector<size_t> c(n, count / n);
  for (size_t k = 0; k < count % n; ++k) ++c[k];
  return c;
}

}  // namespace

void ring_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                    const RingOptions& opt, std::vector<uint8_t>& scratch, TransferStats* stats) {
  timed_transfer(stats, [&](TransferStats* st) {
    if (comm.size() > 1 && count > 0) {
      Ring ring(comm, buf, balanced_segments(count, comm.size()), dt, op, opt, scratch, st);
      ring.reduce_scatter(/*then_allgather=*/true);
      ring.allgather();
    } else if (opt.input && count > 0) {
      std::memcpy(buf, opt.input, count * dtype_size(dt));
    }
  });
}

void ring_reducescatter(MpiComm& comm, void* buf, const std::vector<size_t>& counts, DataType dt,
                        ReduceOp op, const RingOptions& opt, std::vector<uint8_t>& scratch,
                        TransferStats* stats) {
  GF_CHECK(counts.size() == static_cast<size_t>(comm.size()),
           "gradflow: reducescatter needs one block size per rank, got " << counts.size()
                                                                           << " for "
                                                                           << comm.size()
                                                                           << " ranks");
  GF_CHECK(opt.input == nullptr, "gradflow: ring reducescatter is in place only");
  size_t total = 0;
  for (size_t c : counts) total += c;
  timed_transfer(stats, [&](TransferStats* st) {
    if (comm.size() > 1 && total > 0) {
      // The owner keeps its block in fp32 on the wire path: no final rounding
      // is needed when no other rank has to match it.
      Ring ring(comm, buf, counts, dt, op, opt, scratch, st);
      ring.reduce_scatter(/*then_allgather=*/false);
    }
  });
}

}  // namespace gradflow
