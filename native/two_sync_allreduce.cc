// two_sync_allreduce.cc — the MiMatrix two-synchronization allreduce (GDRAA)
// over MpiComm RMA windows: shared-memory loads on one node, MPI_Get across
// nodes. Owns the two alternating windows; never reads configuration.
//
// The algorithm
// -------------
// Glossary: segment q = the 1/N share of the buffer owned (reduced) by rank
// q, balanced as count/N with the remainder spread over the first segments;
// window = a rank's RMA-exposed copy of its buffer; sync = RmaWindow::sync()
// (memory barrier + barrier with deadline + memory barrier).
//
//   Phase 0, publish: rank r copies its input into its window (encoded to
//            16-bit on the fp16/bf16 wire path).
//   sync 1
//   Phase 1, reduce: rank r reads segment r from every rank's window, in
//            rank order 0..N-1, reduces (fixed order: deterministic), keeps
//            the result in its buffer and writes it into segment r of its own
//            window (wire path: the fp32 sum of the 16-bit shards is rounded
//            once, and the owner keeps decode(encode(sum)) like everyone).
//   sync 2
//   Phase 2, gather: rank r copies every other segment q from owner q's
//            window into its buffer. All ranks copy the same bytes, so the
//            result is bitwise identical everywhere.
//
// Cost: two synchronizations; each rank reads (N-1)/N of the buffer in each
// phase (2(N-1)/N in all, like the ring) but in O(1) handshakes, not 2(N-1).
//
// Why two windows make two syncs enough (Note [Alternating windows])
// -------------------------------------------------------------------
// Call k uses window W[k % 2]. Within call k, rank r's window is written by r
// only in phase 0 (whole buffer, before sync 1) and phase 1 (segment r only);
// peers read its segments q != r in phase 1, disjoint from segment r, and its
// segment r in phase 2, after sync 2, which r entered after writing it.
// Across calls: the next write of W[k % 2] is in call k+2's phase 0, which
// rank r reaches only after passing sync 1 of call k+1; no peer enters that
// sync before finishing phase 2 of call k, so no peer still reads W[k % 2].
// With one window, call k+1's phase 0 could overwrite data a slow peer is
// still reading in call k's phase 2, and a third sync per call would be
// needed. Growing W[k % 2] (free + allocate, collective; all ranks see the
// same count so they agree) is safe by the same argument.
#include "two_sync_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "reduce_kernels.h"
#include "wire_codec.h"

namespace gradflow {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

struct TwoSyncAllreduce::Impl {
  Impl(MpiComm& c, bool shared) : comm(c), prefer_shared(shared) {}
  MpiComm& comm;
  bool prefer_shared;
  std::unique_ptr<RmaWindow> windows[2];  // alternate between calls
  uint64_t calls = 0;
  std::vector<uint8_t> fetched;  // MPI_Get path: peers' shards of segment r

  RmaWindow& window_for_call(size_t bytes) {
    std::unique_ptr<RmaWindow>& w = windows[calls++ % 2];
    if (!w || w->bytes() < bytes) {
      size_t grown = w ? std::max(bytes, w->bytes() + w->bytes() / 2) : bytes;
      grown = (grown + 4095) & ~size_t{4095};
      if (w) {
        comm.barrier("two-sync window resize");  // MPI_Win_free has no deadline
        w.reset();
      }
      w = comm.create_window(grown, prefer_shared);
    }
    return *w;
  }
};

TwoSyncAllreduce::TwoSyncAllreduce(MpiComm& comm, bool prefer_shared)
    : impl_(new Impl(comm, prefer_shared)) {}
TwoSyncAllreduce::~TwoSyncAllreduce() {
  // MPI_Win_free (in ~RmaWindow) waits for every rank without a deadline: a
  // deadline barrier first, so a dead or absent peer makes this a timeout
  // (which marks the communicator broken, and the windows are then leaked:
  // Note [Collective destruction] in mpi_comm.h) instead of a hang at exit.
  if (!impl_->windows[0] && !impl_->windows[1]) return;
  if (impl_->comm.broken()) return;
  try {
    impl_->comm.barrier("two-sync window free");
  } catch (const std::exception&) {
  }
}

bool TwoSyncAllreduce::uses_shared_memory() const {
  return impl_->prefer_shared && impl_->comm.shared_windows();
}

void TwoSyncAllreduce::allreduce(void* buf, size_t count, DataType dt, ReduceOp op,
                                 WireDtype wire, TransferStats* stats) {
  std::string why;
  GF_CHECK(reduce_supported(dt, op, &why), "gradflow: two-sync allreduce: " << why);
  TransferStats local;
  TransferStats* st = stats ? stats : &local;
  auto t0 = Clock::now();
  MpiComm& comm = impl_->comm;
  const int n = comm.size(), r = comm.rank();
  if (n == 1 || count == 0) {
    st->transfer_seconds += seconds_since(t0);
    return;
  }
  const bool wired = wire != WireDtype::kNative && dt == DataType::kFloat32 &&
                     (op == ReduceOp::kSum || op == ReduceOp::kAverage);
  const size_t es = dtype_size(dt), ws = wired ? 2 : es;  // buffer / window element size
  std::vector<size_t> cnt(n, count / n), off(n, 0);
  for (size_t k = 0; k < count % n; ++k) ++cnt[k];
  for (int k = 1; k < n; ++k) off[k] = off[k - 1] + cnt[k - 1];

  uint8_t* data = static_cast<uint8_t*>(buf);
  float* fdata = static_cast<float*>(buf);
  RmaWindow& win = impl_->window_for_call(count * ws);
  uint8_t* mine = static_cast<uint8_t*>(win.local_base());
  const bool shared = win.is_shared();

  // Phase 0: publish the input.
  if (wired) {
    timed_codec(st, [&] {
      if (encode_f32(wire, fdata, reinterpret_cast<uint16_t*>(mine), count))
        st->wire_overflow = true;
    });
  } else {
    std::memcpy(mine, data, count * es);
  }
  win.sync("two-sync allreduce (sync 1)");

  // Phase 1: reduce segment r over all ranks, in rank order.
  const size_t seg_bytes = cnt[r] * ws;
  std::vector<const uint8_t*> shard(n);  // segment r of rank p's window
  if (shared) {
    for (int p = 0; p < n; ++p)
      shard[p] = static_cast<const uint8_t*>(win.peer_base(p)) + off[r] * ws;
  } else {
    if (impl_->fetched.size() < n * seg_bytes) impl_->fetched.resize(n * seg_bytes);
    for (int p = 0; p < n; ++p) {
      shard[p] = p == r ? mine + off[r] * ws : impl_->fetched.data() + p * seg_bytes;
      if (p != r && seg_bytes > 0)
        win.get(impl_->fetched.data() + p * seg_bytes, seg_bytes, p, off[r] * ws);
    }
    win.flush();
  }
  uint8_t* out = data + off[r] * es;  // segment r of the caller's buffer
  if (wired) {
    float* fout = fdata + off[r];
    timed_codec(st, [&] {
      decode_f32(wire, reinterpret_cast<const uint16_t*>(shard[0]), fout, cnt[r]);
      for (int p = 1; p < n; ++p)
        decode_accumulate_f32(wire, reinterpret_cast<const uint16_t*>(shard[p]), fout, cnt[r]);
      uint16_t* rounded = reinterpret_cast<uint16_t*>(mine + off[r] * ws);
      if (encode_f32(wire, fout, rounded, cnt[r])) st->wire_overflow = true;
      decode_f32(wire, rounded, fout, cnt[r]);
    });
  } else {
    std::memcpy(out, shard[0], seg_bytes);
    for (int p = 1; p < n; ++p) reduce_into(out, shard[p], cnt[r], dt, op);
    std::memcpy(mine + off[r] * ws, out, seg_bytes);
  }
  win.sync("two-sync allreduce (sync 2)");

  // Phase 2: gather the other reduced segments from their owners (the MPI_Get
  // wire path stages the 16-bit segments in `fetched`, then decodes).
  if (!shared && wired && impl_->fetched.size() < count * ws) impl_->fetched.resize(count * ws);
  for (int q = 0; q < n; ++q) {
    if (q == r || cnt[q] == 0) continue;
    const size_t bytes = cnt[q] * ws;
    if (shared) {
      const uint8_t* src = static_cast<const uint8_t*>(win.peer_base(q)) + off[q] * ws;
      if (wired) {
        timed_codec(st, [&] {
          decode_f32(wire, reinterpret_cast<const uint16_t*>(src), fdata + off[q], cnt[q]);
        });
      } else {
        std::memcpy(data + off[q] * es, src, bytes);
      }
    } else {
      uint8_t* dst = wired ? impl_->fetched.data() + off[q] * ws : data + off[q] * es;
      win.get(dst, bytes, q, off[q] * ws);
    }
  }
  if (!shared) {
    win.flush();
    if (wired) {
      timed_codec(st, [&] {
        for (int q = 0; q < n; ++q)
          if (q != r)
            decode_f32(wire, reinterpret_cast<const uint16_t*>(impl_->fetched.data() + off[q] * ws),
                       fdata + off[q], cnt[q]);
      });
    }
  }

  // Bytes moved: peers read (N-1) of our shards in phase 1 and our segment N-1
  // times in phase 2; we read the mirror image.
  const uint64_t others = (count - cnt[r]) * ws;
  st->bytes_received += static_cast<uint64_t>(n - 1) * seg_bytes + others;
  st->bytes_sent += others + static_cast<uint64_t>(n - 1) * seg_bytes;
  st->transfer_seconds += seconds_since(t0);
}

}  // namespace gradflow
