// mpi_allreduce.cc — the "mpi" allreduce algorithm (see mpi_allreduce.h).
// Sees only MpiComm's collectives, the wire codec and the reduce kernels.
//
// The exchange (16-bit wire, or 16-bit data)
// ------------------------------------------
// Segments as in the ring and two-sync: segment q (count/N elements, the
// remainder spread over the first segments) is owned by rank q.
//   Step 1, scatter: MPI_Alltoallv sends segment q of every rank's buffer to
//           rank q (encoded to 16-bit on the wire path).
//   Step 2, reduce: rank r reduces the N shards of segment r in rank order
//           0..N-1 (wire path: fp32 sum of the decoded shards, rounded once;
//           the owner keeps decode(encode(sum)) like everyone else).
//   Step 3, gather: MPI_Allgatherv gives every rank every owner's reduced
//           segment (16-bit bytes on the wire path, decoded on arrival).
// The owners' bytes are copied unchanged to every rank, so all ranks end
// bitwise identical, and the numbers equal the two-sync allreduce's (same
// reduction order, same single rounding). Cost: 2(N-1)/N of the buffer sent
// and received per rank, in two MPI collectives.
#include "mpi_allreduce.h"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.h"
#include "wire_codec.h"

namespace gradflow {

namespace {
bool wired(DataType dt, ReduceOp op, WireDtype wire) {
  return wire != WireDtype::kNative && dt == DataType::kFloat32 &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage);
}

// Every NaN in `v` becomes `quiet` (the positive quiet NaN, numpy's np.nan).
// Integer compares on the bits, so the loop vectorises: |x| > inf's bits is
// exactly "x is NaN".
template <typename Bits>
void canonical_nans(Bits* v, size_t count, Bits inf, Bits quiet) {
  const Bits magnitude = static_cast<Bits>(~(Bits(1) << (8 * sizeof(Bits) - 1)));
  for (size_t i = 0; i < count; ++i) v[i] = (v[i] & magnitude) > inf ? quiet : v[i];
}
}  // namespace

// Note [NaN bits after MPI_Allreduce]
// MPI_SUM / MPI_PROD on floats give the same numbers on every rank but not
// always the same NaN: ranks may combine the operands in different orders
// (a + b on one, b + a on another), and x86 keeps the first operand's NaN,
// sign bit and payload included; inf - inf makes -nan. With MPICH, +nan on
// one rank and -nan on another at one element gave different bytes on 2, 3
// and 4 ranks (special_values_script.py). The project's rule is
// bitwise-identical results, so after MPI_Allreduce every float32/float64
// NaN becomes the one positive quiet NaN (numpy's np.nan). The pass costs
// about 2 ms on 64 MiB (float32 or float64, -O3, this project's 2-core test
// machine) against about 120 ms for a 2-rank allreduce of that buffer here;
// the owner-reduce exchange that float min/max take would add a second
// collective to every float sum for the sake of NaNs.

// MPI_MIN / MPI_MAX on floats are not commutative where NaN or a signed
// zero meet ((a < b) ? a : b keeps whichever operand came second), and the
// library's exchange hands each rank the operands in its own order: with
// MPICH, min(NaN, 1) was NaN on one rank and 1 on the other, min(-0, +0)
// -0 on one and +0 on the other. Floating min/max therefore take the
// exchange, whose owner reduces with the kernels' rule (NaN propagates,
// -0 < +0), as the other algorithms do.
bool mpi_allreduce_is_builtin(DataType dt, ReduceOp op, WireDtype wire) {
  const bool floating_min_max = (dt == DataType::kFloat32 || dt == DataType::kFloat64) &&
                                (op == ReduceOp::kMin || op == ReduceOp::kMax);
  return !wired(dt, op, wire) && dt != DataType::kFloat16 && dt != DataType::kBFloat16 &&
         !floating_min_max;
}

void mpi_allreduce(MpiComm& comm, void* buf, size_t count, DataType dt, ReduceOp op,
                   WireDtype wire, std::vector<uint8_t>& scratch, TransferStats* stats) {
  TransferStats local;
  TransferStats* st = stats ? stats : &local;
  const int n = comm.size(), r = comm.rank();
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dt);
  if (mpi_allreduce_is_builtin(dt, op, wire)) {
    comm.allreduce_builtin(buf, count, dt, op, "allreduce (MPI)");
    // Note [NaN bits after MPI_Allreduce]. fp16/bf16 never get here.
    if (dt == DataType::kFloat32)
      canonical_nans(static_cast<uint32_t*>(buf), count, uint32_t{0x7f800000u},
                     uint32_t{0x7fc00000u});
    else if (dt == DataType::kFloat64)
      canonical_nans(static_cast<uint64_t*>(buf), count, uint64_t{0x7ff0000000000000ull},
                     uint64_t{0x7ff8000000000000ull});
    // What a bandwidth-optimal MPI_Allreduce moves (the library does not say).
    st->bytes_sent += 2 * count * es * (n - 1) / n;
    st->bytes_received += 2 * count * es * (n - 1) / n;
    return;
  }
  std::string why;
  GF_CHECK(reduce_supported(dt, op, &why), "gradflow: MPI allreduce: " << why);
  const bool w = wired(dt, op, wire);
  const size_t ws = w ? 2 : es;  // element size on the wire
  std::vector<size_t> cnt(n, count / n), off(n, 0);
  for (size_t k = 0; k < count % n; ++k) ++cnt[k];
  for (int k = 1; k < n; ++k) off[k] = off[k - 1] + cnt[k - 1];

  // Scratch: [16-bit image of the buffer (wire only)][N shards of segment r]
  // [gathered result].
  const size_t image = w ? align64(count * ws) : 0, shards = align64(n * cnt[r] * ws);
  if (scratch.size() < image + shards + count * ws) scratch.resize(image + shards + count * ws);
  uint8_t* send = w ? scratch.data() : static_cast<uint8_t*>(buf);
  uint8_t* recv = scratch.data() + image;
  uint8_t* gathered = recv + shards;
  float* fdata = static_cast<float*>(buf);

  // Step 1: segment q of every rank to its owner q.
  if (w) {
    timed_codec(st, [&] {
      if (encode_f32(wire, fdata, reinterpret_cast<uint16_t*>(send), count))
        st->wire_overflow = true;
    });
  }
  std::vector<size_t> send_bytes(n), recv_bytes(n, cnt[r] * ws), seg_bytes(n);
  for (int q = 0; q < n; ++q) send_bytes[q] = seg_bytes[q] = cnt[q] * ws;
  // Every rank sends count * ws bytes; rank 0 owns the largest segment and
  // receives the most: the same number everywhere (see MpiComm::alltoallv).
  const size_t largest = std::max(count * ws, cnt[0] * n * ws);
  comm.alltoallv(send, send_bytes, recv, recv_bytes, largest, "allreduce (MPI alltoall of shards)");

  // Step 2: reduce segment r in rank order. The result is kept in segment r
  // of the send image (wire) or of the buffer, both free once the alltoall
  // is done: MPI forbids a send block inside the receive buffer.
  uint8_t* mine = send + off[r] * ws;
  if (w) {
    timed_codec(st, [&] {
      float* acc = fdata + off[r];
      const uint16_t* sh = reinterpret_cast<const uint16_t*>(recv);
      decode_f32(wire, sh, acc, cnt[r]);
      for (int p = 1; p < n; ++p) decode_accumulate_f32(wire, sh + p * cnt[r], acc, cnt[r]);
      if (encode_f32(wire, acc, reinterpret_cast<uint16_t*>(mine), cnt[r]))
        st->wire_overflow = true;
    });
  } else if (cnt[r] > 0) {
    std::memcpy(mine, recv, cnt[r] * es);
    for (int p = 1; p < n; ++p) reduce_into(mine, recv + p * cnt[r] * es, cnt[r], dt, op);
  }

  // Step 3: every owner's segment to everyone.
  comm.allgatherv(mine, seg_bytes[r], gathered, seg_bytes, "allreduce (MPI allgather)");
  if (w) {
    timed_codec(st, [&] {
      decode_f32(wire, reinterpret_cast<const uint16_t*>(gathered), fdata, count);
    });
  } else {
    std::memcpy(buf, gathered, count * es);
  }
  const uint64_t others = (count - cnt[r]) * ws, incoming = (n - 1) * cnt[r] * ws;
  st->bytes_sent += others + incoming;  // shards out, then our segment to N-1 peers
  st->bytes_received += incoming + others;
}

}  // namespace gradflow
