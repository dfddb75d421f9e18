// transport_test.cc — SPMD test of the transport layer: MpiComm, ring
// allreduce / reduce-scatter, two-sync allreduce (shared and MPI_Get paths),
// the mpi algorithm's 16-bit exchange and the collectives, against closed
// forms (16-bit wire: a model of its rounding); a timeout test; a ring vs
// MPI_Allreduce timing (printed only). Run under mpiexec at N = 1..4; exits
// non-zero on any failure (on every rank).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "collectives.h"
#include "mpi_allreduce.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"
#include "two_sync_allreduce.h"
#include "wire_codec.h"

using namespace gradflow;

namespace {

int g_fail = 0;
int R = 0, N = 1;
#define EXPECT(cond, msg)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ++g_fail;                                                            \
      std::ostringstream os_;                                              \
      os_ << msg;                                                          \
      std::fprintf(stderr, "[rank %d] FAIL %s:%d: %s\n", R, __FILE__, __LINE__, os_.str().c_str()); \
    }                                                                      \
  } while (0)

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- typed element access (all test values are small integers: exact) ----
void store(void* b, size_t i, DataType dt, double v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(b)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(b)[i] = v; break;
    case DataType::kInt32: static_cast<int32_t*>(b)[i] = static_cast<int32_t>(v); break;
    case DataType::kFloat16: static_cast<uint16_t*>(b)[i] = float_to_half(static_cast<float>(v)); break;
    default: throw GradflowError("test: dtype not covered");
  }
}
double load(const void* b, size_t i, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(b)[i];
    case DataType::kFloat64: return static_cast<const double*>(b)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(b)[i];
    case DataType::kFloat16: return half_to_float(static_cast<const uint16_t*>(b)[i]);
    default: throw GradflowError("test: dtype not covered");
  }
}

// Input of rank r at index i, per op, and the closed-form reduction.
double value(ReduceOp op, int r, size_t i) {
  switch (op) {
    case ReduceOp::kSum: return (r + 1) * static_cast<double>(i % 7);
    case ReduceOp::kProduct: return static_cast<double>((r + i) % 4 + 1);
    default: return static_cast<double>((r * 5 + i * 3) % 11) - 5;  // min / max
  }
}
double expected(ReduceOp op, size_t i) {
  if (op == ReduceOp::kSum) return static_cast<double>(i % 7) * N * (N + 1) / 2;
  double acc = value(op, 0, i);
  for (int r = 1; r < N; ++r) {
    double v = value(op, r, i);
    acc = op == ReduceOp::kProduct ? acc * v : op == ReduceOp::kMin ? std::min(acc, v) : std::max(acc, v);
  }
  return acc;
}

void fill(std::vector<uint8_t>& buf, size_t count, DataType dt, ReduceOp op) {
  buf.assign(count * dtype_size(dt) + 1, 0xEE);  // +1 guard byte
  for (size_t i = 0; i < count; ++i) store(buf.data(), i, dt, value(op, R, i));
}

// Checks elements [lo, hi) against the closed form; reports the first miss.
void check(const std::vector<uint8_t>& buf, size_t lo, size_t hi, DataType dt, ReduceOp op,
           const std::string& what, size_t base = 0) {
  size_t bad = 0;
  for (size_t i = lo; i < hi; ++i) {
    double got = load(buf.data(), i - base, dt), want = expected(op, i);
    if (got != want) {
      if (bad++ == 0)
        EXPECT(false, what << ": element " << i << " = " << got << ", expected " << want);
    }
  }
  if (bad > 1) EXPECT(false, what << ": " << bad << " wrong elements in all");
}

uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  return h;
}

// True if `h` is the same on every rank.
bool same_everywhere(MpiComm& c, uint64_t h) {
  std::vector<uint64_t> all(N);
  c.allgatherv(&h, 8, all.data(), std::vector<size_t>(N, 8), "test hash");
  return std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == h; });
}

std::string label(const char* algo, size_t count, DataType dt, ReduceOp op, size_t pipe = 0) {
  std::ostringstream os;
  os << algo << " n=" << count << " " << dtype_name(dt) << " " << reduce_op_name(op);
  if (pipe) os << " pipe=" << pipe;
  return os.str();
}

// ---- allreduce: ring at two pipeline sizes, two-sync shared and MPI_Get ----
void test_allreduce(MpiComm& c, TwoSyncAllreduce& ts_shared, TwoSyncAllreduce& ts_get) {
  const DataType dts[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kFloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
  std::vector<size_t> counts = {0, 1, size_t(std::max(N - 1, 0)), size_t(N + 1), 1000003};
  std::vector<uint8_t> buf, scratch;
  for (size_t count : counts)
    for (DataType dt : dts)
      for (ReduceOp op : ops) {
        for (size_t pipe : {size_t{4096}, size_t{1} << 20}) {
          fill(buf, count, dt, op);
          RingOptions opt;
          opt.pipeline_bytes = pipe;
          ring_allreduce(c, buf.data(), count, dt, op, opt, scratch, nullptr);
          check(buf, 0, count, dt, op, label("ring", count, dt, op, pipe));
          EXPECT(buf.back() == 0xEE, "ring wrote past the end");
        }
        for (TwoSyncAllreduce* ts : {&ts_shared, &ts_get}) {
          fill(buf, count, dt, op);
          ts->allreduce(buf.data(), count, dt, op, WireDtype::kNative, nullptr);
          check(buf, 0, count, dt, op, label(ts == &ts_shared ? "two-sync" : "two-sync-get", count, dt, op));
          EXPECT(buf.back() == 0xEE, "two-sync wrote past the end");
        }
      }
  // 20M floats: ring, both two-sync paths, MPI_Allreduce.
  const size_t big = 20000000;
  for (int algo = 0; algo < 4; ++algo) {
    fill(buf, big, DataType::kFloat32, ReduceOp::kSum);
    RingOptions opt;
    if (algo == 0) ring_allreduce(c, buf.data(), big, DataType::kFloat32, ReduceOp::kSum, opt, scratch, nullptr);
    if (algo == 1) ts_shared.allreduce(buf.data(), big, DataType::kFloat32, ReduceOp::kSum, WireDtype::kNative, nullptr);
    if (algo == 2) ts_get.allreduce(buf.data(), big, DataType::kFloat32, ReduceOp::kSum, WireDtype::kNative, nullptr);
    if (algo == 3) c.allreduce_builtin(buf.data(), big, DataType::kFloat32, ReduceOp::kSum, "test");
    const char* names[] = {"ring", "two-sync", "two-sync-get", "MPI_Allreduce"};
    check(buf, 0, big, DataType::kFloat32, ReduceOp::kSum, label(names[algo], big, DataType::kFloat32, ReduceOp::kSum));
  }
}

// ---- 16-bit wire: bit for bit the documented rounding, identical on all ranks ----
// Inputs with full fp32 mantissas from 1e-6 to 1e3 (fp16 subnormals included).
float wire_input(int r, size_t i) {
  uint64_t z = (static_cast<uint64_t>(r) << 40) + i + 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  static const float kScale[10] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f, 1e3f};
  float u = static_cast<float>(z & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
  return u * kScale[(z >> 32) % 10];
}
uint16_t enc(WireDtype w, float f) { return w == WireDtype::kFloat16 ? float_to_half(f) : float_to_bf16(f); }
float dec(WireDtype w, uint16_t h) { return w == WireDtype::kFloat16 ? half_to_float(h) : bf16_to_float(h); }

// The documented result for element i of segment k (docs/architecture.md,
// "16-bit wire"): the ring rounds at every hop starting at rank k+1 and
// ending at the owner k; two-sync and mpi sum the N rounded inputs in rank
// order in fp32 and round once.
float wire_model(WireDtype w, bool ring, int k, size_t i) {
  if (ring) {
    uint16_t acc = enc(w, wire_input((k + 1) % N, i));
    for (int hop = 2; hop <= N; ++hop) acc = enc(w, wire_input((k + hop) % N, i) + dec(w, acc));
    return dec(w, acc);
  }
  float s = dec(w, enc(w, wire_input(0, i)));
  for (int p = 1; p < N; ++p) s += dec(w, enc(w, wire_input(p, i)));
  return dec(w, enc(w, s));
}

void test_wire(MpiComm& c, TwoSyncAllreduce& ts_shared, TwoSyncAllreduce& ts_get) {
  std::vector<uint8_t> scratch;
  std::vector<float> model;
  const char* names[] = {"ring", "ring pipe=4 KiB", "two-sync", "two-sync-get", "mpi exchange"};
  for (WireDtype w : {WireDtype::kFloat16, WireDtype::kBFloat16})
    for (size_t count : {size_t{1}, size_t(N + 1), size_t{1000003}, size_t{20000000}})
      for (int algo = 0; algo < 5; ++algo) {
        // At 20M: the small pipe and the MPI exchange are slow and add nothing new.
        if (count == 20000000 && (algo == 1 || algo == 4)) continue;
        std::vector<float> b(count);
        for (size_t i = 0; i < count; ++i) b[i] = wire_input(R, i);
        TransferStats st;
        RingOptions opt;
        opt.wire = w;
        opt.pipeline_bytes = algo == 1 ? 4096 : 1 << 20;
        if (algo <= 1) ring_allreduce(c, b.data(), count, DataType::kFloat32, ReduceOp::kSum, opt, scratch, &st);
        if (algo == 2) ts_shared.allreduce(b.data(), count, DataType::kFloat32, ReduceOp::kSum, w, &st);
        if (algo == 3) ts_get.allreduce(b.data(), count, DataType::kFloat32, ReduceOp::kSum, w, &st);
        if (algo == 4) mpi_allreduce(c, b.data(), count, DataType::kFloat32, ReduceOp::kSum, w, scratch, &st);
        if (N > 1) {
          // The model is computed once per family (ring: algos 0-1; owner:
          // 2-4), at 20M on every 97th element only (the model is slow).
          const size_t stride = count > 2000000 ? 97 : 1;
          if (algo == 0 || algo == 2) {
            model.resize(count);
            size_t i = 0;
            for (int k = 0; k < N; ++k) {
              const size_t seg_end = i + count / N + (static_cast<size_t>(k) < count % N ? 1 : 0);
              for (; i < seg_end; ++i)
                if (i % stride == 0) model[i] = wire_model(w, algo == 0, k, i);
            }
          }
          size_t bad = 0;
          for (size_t i = 0; i < count; i += stride)
            if (std::memcmp(&b[i], &model[i], 4) != 0 && bad++ == 0)
              EXPECT(false, wire_dtype_name(w) << " wire " << names[algo] << " n=" << count << ": element "
                                               << i << " = " << b[i] << ", model " << model[i]);
          EXPECT(bad == 0, names[algo] << ": " << bad << " elements differ from the model");
        }
        EXPECT(same_everywhere(c, fnv(b.data(), count * 4)),
               wire_dtype_name(w) << " wire " << names[algo] << " n=" << count << ": ranks differ bitwise");
        EXPECT(!st.wire_overflow, "spurious wire overflow");
        if (N > 1 && algo != 2) EXPECT(st.bytes_sent > 0 && st.bytes_received > 0, "stats bytes not filled");
      }
  // Overflow: 1e5 does not fit fp16; every ring rank encodes segment 0.
  std::vector<float> b(N + 1, 1.0f);
  b[0] = 1e5f;
  TransferStats st;
  RingOptions opt;
  opt.wire = WireDtype::kFloat16;
  ring_allreduce(c, b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum, opt, scratch, &st);
  int64_t any = st.wire_overflow ? 1 : 0;
  c.allreduce_max_i64(&any, 1, "test");
  EXPECT(N == 1 || any == 1, "fp16 overflow not reported");
}

// ---- reduce-scatter (ring and collective), uneven blocks ----
void test_reducescatter(MpiComm& c) {
  std::vector<uint8_t> buf, scratch, out;
  for (size_t m : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}})
    for (DataType dt : {DataType::kFloat32, DataType::kInt32, DataType::kFloat16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct})
        for (size_t pipe : {size_t{4096}, size_t{1} << 20}) {
          std::vector<size_t> counts(N);
          std::vector<int64_t> rows(N);
          size_t total = 0, mine = 0;
          for (int p = 0; p < N; ++p) {
            counts[p] = (p + 1) * m + (p == 0 ? 2 : 0);  // uneven, rank 0 gets extra
            rows[p] = static_cast<int64_t>(counts[p]);
            if (p < R) mine += counts[p];
            total += counts[p];
          }
          RingOptions opt;
          opt.pipeline_bytes = pipe;
          fill(buf, total, dt, op);
          ring_reducescatter(c, buf.data(), counts, dt, op, opt, scratch, nullptr);
          check(buf, mine, mine + counts[R], dt, op, label("ring_reducescatter", total, dt, op, pipe));
          fill(buf, total, dt, op);
          out.assign(counts[R] * dtype_size(dt), 0);
          TransferStats st;
          reducescatter(c, buf.data(), out.data(), rows, 1, dt, op, opt, scratch, &st);
          check(out, mine, mine + counts[R], dt, op, label("reducescatter", total, dt, op, pipe), mine);
        }
  // fp16 wire: block r equals the exact sum within tolerance.
  const size_t m = 100003;
  std::vector<size_t> counts(N, m);
  std::vector<float> b(m * N);
  for (size_t i = 0; i < b.size(); ++i) b[i] = (R + 1) * 0.3f + 0.001f * (i % 17);
  RingOptions opt;
  opt.wire = WireDtype::kFloat16;
  std::vector<uint8_t> s;
  ring_reducescatter(c, b.data(), counts, DataType::kFloat32, ReduceOp::kSum, opt, s, nullptr);
  size_t bad = 0;
  for (size_t i = R * m; i < (R + 1) * m; ++i) {
    double want = 0.3 * N * (N + 1) / 2 + 0.001 * (i % 17) * N;
    if (std::fabs(b[i] - want) > want * (N + 1) / 1024.0) ++bad;
  }
  EXPECT(bad == 0, "fp16-wire reducescatter: " << bad << " elements off");
}

// ---- allgather / broadcast / alltoall / control collectives ----
void test_collectives(MpiComm& c) {
  for (size_t row_elems : {size_t{3}, size_t{5} << 20}) {  // 5M floats/row: >64 MiB totals at N >= 4
    std::vector<int64_t> dims(N);
    size_t total_rows = 0, before = 0;
    for (int p = 0; p < N; ++p) {
      dims[p] = row_elems > 3 ? 1 : (p % 3);  // includes zero-row ranks
      if (p < R) before += dims[p];
      total_rows += dims[p];
    }
    std::vector<float> in(dims[R] * row_elems), out(total_rows * row_elems, -1.f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(R * 1000 + (before * row_elems + i) % 977);
    TransferStats st;
    allgather(c, in.data(), out.data(), dims, row_elems, DataType::kFloat32, &st);
    size_t bad = 0, row = 0;
    for (int p = 0; p < N; ++p)
      for (int64_t k = 0; k < dims[p]; ++k, ++row)
        for (size_t e = 0; e < row_elems; ++e)
          if (out[row * row_elems + e] != static_cast<float>(p * 1000 + (row * row_elems + e) % 977)) ++bad;
    EXPECT(bad == 0, "allgather row_elems=" << row_elems << ": " << bad << " wrong");
  }
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{70} << 20}) {
    std::vector<uint8_t> b(bytes, 0);
    const int root = N - 1;
    if (R == root)
      for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 7 + 3);
    broadcast(c, b.data(), bytes, root, nullptr);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; ++i) bad += b[i] != static_cast<uint8_t>(i * 7 + 3);
    EXPECT(bad == 0, "broadcast " << bytes << " bytes: " << bad << " wrong");
  }
  for (size_t row_elems : {size_t{2}, size_t{3} << 20}) {
    // Rank s sends (s + d) % 3 rows to rank d; values encode (s, d, element).
    std::vector<int64_t> ss(N), rs(N);
    for (int p = 0; p < N; ++p) ss[p] = rs[p] = (R + p) % 3;
    size_t sn = 0, rn = 0;
    for (int p = 0; p < N; ++p) sn += ss[p] * row_elems, rn += rs[p] * row_elems;
    std::vector<int32_t> in(sn), out(rn, -1);
    size_t k = 0;
    for (int d = 0; d < N; ++d)
      for (size_t e = 0; e < ss[d] * row_elems; ++e) in[k++] = static_cast<int32_t>(R * 100000 + d * 1000 + e % 997);
    std::vector<int64_t> matrix(N * N);
    for (int s = 0; s < N; ++s)
      for (int d = 0; d < N; ++d) matrix[s * N + d] = (s + d) % 3;
    alltoall(c, in.data(), out.data(), matrix, row_elems, DataType::kInt32, nullptr);
    size_t bad = 0;
    k = 0;
    for (int s = 0; s < N; ++s)
      for (size_t e = 0; e < rs[s] * row_elems; ++e) bad += out[k++] != static_cast<int32_t>(s * 100000 + R * 1000 + e % 997);
    EXPECT(bad == 0, "alltoall row_elems=" << row_elems << ": " << bad << " wrong");
  }
  // Control collectives.
  c.barrier("test barrier");
  uint64_t words[2] = {~0ull ^ (1ull << R), 0xFFull};
  c.allreduce_band(words, 2, "test band");
  uint64_t want = ~0ull;
  for (int p = 0; p < N; ++p) want ^= 1ull << p;
  EXPECT(words[0] == want && words[1] == 0xFF, "allreduce_band");
  int64_t mx = R * 10;
  c.allreduce_max_i64(&mx, 1, "test max");
  EXPECT(mx == (N - 1) * 10, "allreduce_max_i64 " << mx);
  std::vector<uint8_t> v;
  if (R == 0) v = {1, 2, 3};
  c.bcast_vector(v, 0, "test bcast_vector");
  EXPECT(v == std::vector<uint8_t>({1, 2, 3}), "bcast_vector");
  auto got = c.gather_to_root(std::vector<uint8_t>(R, static_cast<uint8_t>(R)), 0, "test gather");
  if (R == 0) {
    EXPECT(got.size() == size_t(N), "gather_to_root size");
    for (int p = 0; p < N && p < int(got.size()); ++p)
      EXPECT(got[p] == std::vector<uint8_t>(p, static_cast<uint8_t>(p)), "gather_to_root from " << p);
  }
}

// ---- deadline: rank 1 never sends; rank 0's wait must throw in ~2 s ----
void test_timeout(MpiComm& c) {
  if (N < 2) return;
  MpiComm quick(0, 2.0);
  if (R == 0) {
    RequestList reqs;
    int x = 0;
    quick.irecv(&x, sizeof x, 1, kTagRing, reqs);
    double t = now();
    std::string msg;
    try { quick.wait_all(reqs, "test recv"); } catch (const GradflowError& e) { msg = e.what(); }
    double dt = now() - t;
    EXPECT(msg.find("timed out after 2 s in test recv waiting for rank 1") != std::string::npos, "timeout message: '" << msg << "'");
    EXPECT(dt >= 1.9 && dt < 3.5, "timeout took " << dt << " s");
    // gather_to_root: every rank but 1 sends; the root names rank 1 only.
    msg.clear();
    try { quick.gather_to_root({1, 2}, 0, "test gather"); } catch (const GradflowError& e) { msg = e.what(); }
    EXPECT(msg.find("waiting for rank 1;") != std::string::npos, "gather timeout message: '" << msg << "'");
  } else if (R != 1) {
    quick.gather_to_root({1, 2}, 0, "test gather");
  }
  c.barrier("after timeout test");
  if (R == 0) std::printf("timeout test done\n");
}

// ---- ring vs MPI_Allreduce vs two-sync at 16 MiB (printed, no asserts) ----
void bench(MpiComm& c, TwoSyncAllreduce& ts) {
  if (N < 2) return;
  const size_t count = (16 << 20) / 4;
  std::vector<float> b(count, 1.0f);
  std::vector<uint8_t> scratch;
  auto time_it = [&](auto fn) {
    fn();  // warm-up
    std::vector<double> t;
    for (int it = 0; it < 7; ++it) {
      c.barrier("bench");
      double t0 = now();
      fn();
      t.push_back(now() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1e3;
  };
  double mpi = time_it([&] { c.allreduce_builtin(b.data(), count, DataType::kFloat32, ReduceOp::kSum, "bench"); });
  if (R == 0) std::printf("bench N=%d 16 MiB fp32: MPI_Allreduce %.2f ms\n", N, mpi);
  for (size_t pipe : {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    RingOptions opt;
    opt.pipeline_bytes = pipe;
    double ms = time_it([&] { ring_allreduce(c, b.data(), count, DataType::kFloat32, ReduceOp::kSum, opt, scratch, nullptr); });
    opt.wire = WireDtype::kFloat16;
    double ms16 = time_it([&] { ring_allreduce(c, b.data(), count, DataType::kFloat32, ReduceOp::kSum, opt, scratch, nullptr); });
    if (R == 0) std::printf("bench   ring pipe=%5zu KiB %.2f ms  (fp16 wire %.2f ms)\n", pipe >> 10, ms, ms16);
  }
  double two = time_it([&] { ts.allreduce(b.data(), count, DataType::kFloat32, ReduceOp::kSum, WireDtype::kNative, nullptr); });
  if (R == 0) std::printf("bench   two-sync (shared=%d) %.2f ms\n", int(ts.uses_shared_memory()), two);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  {
    MpiComm c(0, 120.0);
    R = c.rank();
    N = c.size();
    if (R == 0) std::printf("N=%d local_size=%d cross_size=%d %s\n", N, c.local_size(), c.cross_size(),
                            MpiComm::library_version().substr(0, 40).c_str());
    EXPECT(c.local_rank() == R && c.cross_size() == 1, "one node: local == world");
    bool bench_only = argc > 1 && std::string(argv[1]) == "bench";
    try {
      TwoSyncAllreduce ts_shared(c), ts_get(c, /*prefer_shared=*/false);
      EXPECT(ts_shared.uses_shared_memory() && !ts_get.uses_shared_memory(), "two-sync paths");
      auto phase = [&](const char* name, auto fn) {
        double t = now();
        fn();
        if (R == 0) std::printf("%-16s %.1f s\n", name, now() - t);
        std::fflush(stdout);
      };
      if (!bench_only) {
        phase("allreduce", [&] { test_allreduce(c, ts_shared, ts_get); });
        phase("wire", [&] { test_wire(c, ts_shared, ts_get); });
        phase("reducescatter", [&] { test_reducescatter(c); });
        phase("collectives", [&] { test_collectives(c); });
        phase("timeout", [&] { test_timeout(c); });
      }
      phase("bench", [&] { bench(c, ts_shared); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] exception: %s\n", R, e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int64_t fails = g_fail;
    c.allreduce_max_i64(&fails, 1, "final");
    if (R == 0) std::printf(fails ? "FAILED\n" : "ALL PASSED\n");
    rc = fails ? 1 : 0;
  }
  MPI_Finalize();
  return rc;
}
