// sparse_fusion_test.cc — unit tests (plain main, no MPI) for sparse_chunks
// (CSC selection, pack/unpack, residual and momentum correction) and
// fusion_buffer (planning and copy accounting). Exit code != 0 on failure.
// Build: g++ -O2 -std=c++17 -Inative native/common.cc native/sparse_chunks.cc
//        native/fusion_buffer.cc native/tests/sparse_fusion_test.cc -o /tmp/sf
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "fusion_buffer.h"
#include "sparse_chunks.h"

using namespace gradflow;

static int g_failures = 0;
static int g_checks = 0;

#define EXPECT(cond)                                                        \
  do {                                                                      \
    ++g_checks;                                                             \
    if (!(cond)) {                                                          \
      ++g_failures;                                                         \
      std::fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

using U32 = std::vector<uint32_t>;
using Sizes = std::vector<size_t>;

static bool throws(const std::function<void()>& f) {
  try {
    f();
  } catch (const GradflowError&) {
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- sparse ---

static void test_num_chunks() {
  EXPECT(num_chunks(0, 4) == 0);
  EXPECT(num_chunks(1, 4) == 1);
  EXPECT(num_chunks(4, 4) == 1);
  EXPECT(num_chunks(5, 4) == 2);
  EXPECT(num_chunks(8, 4) == 2);
  EXPECT(throws([] { num_chunks(8, 0); }));
}

static void test_importance_short_last_chunk() {
  std::vector<float> v = {1, -2, 3, -4, 5, -6, 7};  // chunks of 3: [1,-2,3] [-4,5,-6] [7]
  std::vector<float> imp;
  chunk_importance(v.data(), v.size(), 3, &imp);
  EXPECT(imp.size() == 3);
  EXPECT(imp[0] == 6.0f && imp[1] == 15.0f && imp[2] == 7.0f);
  chunk_importance(nullptr, 0, 3, &imp);
  EXPECT(imp.empty());
  // Accumulated in double: 2^24 + 1 + 1 ... is exact in double, not in float.
  std::vector<float> big(5, 1.0f);
  big[0] = 16777216.0f;
  chunk_importance(big.data(), big.size(), 5, &imp);
  EXPECT(imp[0] == 16777220.0f);
}

static void test_select_ties_and_edges() {
  std::vector<float> imp = {1, 5, 3, 5, 5, 0};
  EXPECT((select_top_chunks(imp, 0) == U32{}));
  EXPECT((select_top_chunks(imp, 1) == U32{1}));        // three 5s: lowest index wins
  EXPECT((select_top_chunks(imp, 2) == U32{1, 3}));
  EXPECT((select_top_chunks(imp, 3) == U32{1, 3, 4}));
  EXPECT((select_top_chunks(imp, 4) == U32{1, 2, 3, 4}));  // sorted ascending
  EXPECT((select_top_chunks(imp, 6) == U32{0, 1, 2, 3, 4, 5}));
  EXPECT((select_top_chunks(imp, 100) == U32{0, 1, 2, 3, 4, 5}));
  EXPECT((select_top_chunks({}, 3) == U32{}));
  std::vector<float> zeros(7, 0.0f);
  EXPECT((select_top_chunks(zeros, 3) == U32{0, 1, 2}));
  std::vector<float> with_nan = {1, NAN, 3};
  EXPECT((select_top_chunks(with_nan, 1) == U32{1}));  // a NaN is sent, not hidden
  EXPECT((select_top_chunks(with_nan, 2) == U32{1, 2}));
}

// Against a brute-force reference on many random vectors with many ties.
static void test_select_matches_reference() {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    size_t n = rng() % 200;
    std::vector<float> imp(n);
    for (auto& x : imp) x = static_cast<float>(rng() % 5);  // many ties
    size_t k = n ? rng() % (n + 2) : 0;
    U32 got = select_top_chunks(imp, k);
    U32 want;
    for (size_t i = 0; i < n && want.size() < k; ++i) {
      // i is chosen iff fewer than k chunks rank above it.
      size_t above = 0;
      for (size_t j = 0; j < n; ++j)
        if (imp[j] > imp[i] || (imp[j] == imp[i] && j < i)) ++above;
      if (above < k) want.push_back(static_cast<uint32_t>(i));
    }
    EXPECT(got == want);
  }
}

static void test_pack_unpack_round_trip() {
  const size_t count = 10, chunk = 3;  // chunks: [0,3) [3,6) [6,9) [9,10)
  std::vector<float> src(count);
  for (size_t i = 0; i < count; ++i) src[i] = static_cast<float>(i + 1);
  U32 chosen = {1, 3};
  EXPECT(packed_size(chosen, count, chunk) == 4);
  EXPECT(packed_size({}, count, chunk) == 0);
  EXPECT(packed_size({0, 1, 2, 3}, count, chunk) == count);
  std::vector<float> packed(4);
  pack_chunks(src.data(), count, chunk, chosen, packed.data());
  EXPECT((packed == std::vector<float>{4, 5, 6, 10}));
  std::vector<float> dst(count, -1.0f);
  unpack_chunks(packed.data(), count, chunk, chosen, dst.data());
  EXPECT((dst == std::vector<float>{-1, -1, -1, 4, 5, 6, -1, -1, -1, 10}));
  // All chunks: packing is the identity.
  U32 all = select_top_chunks(std::vector<float>(4, 1.0f), 4);
  std::vector<float> p2(count), d2(count);
  pack_chunks(src.data(), count, chunk, all, p2.data());
  unpack_chunks(p2.data(), count, chunk, all, d2.data());
  EXPECT(p2 == src && d2 == src);
  EXPECT(throws([&] { packed_size({4}, count, chunk); }));
  EXPECT(throws([&] { pack_chunks(src.data(), count, chunk, {4}, packed.data()); }));
}

// One CSC step on a single rank: pick k chunks of the residual, "send" them.
static std::vector<float> sparse_step(SparseResidual* r, const std::vector<float>& grad, size_t k,
                                      U32* chosen) {
  r->accumulate(grad.data());
  std::vector<float> imp;
  r->importance(&imp);
  *chosen = select_top_chunks(imp, k);
  std::vector<float> packed(packed_size(*chosen, r->count(), r->chunk_elems()));
  pack_chunks(r->residual(), r->count(), r->chunk_elems(), *chosen, packed.data());
  std::vector<float> sent(r->count(), 0.0f);
  unpack_chunks(packed.data(), r->count(), r->chunk_elems(), *chosen, sent.data());
  r->clear_sent(*chosen);
  return sent;
}

static void test_residual_conservation() {
  std::mt19937 rng(11);
  for (size_t count : {0u, 1u, 7u, 64u, 101u}) {
    for (size_t k : {0u, 1u, 3u, 1000u}) {
      const size_t chunk = 8;
      SparseResidual r(count, chunk, 0.0f);
      std::vector<double> grad_sum(count, 0.0), sent_sum(count, 0.0);
      for (int step = 0; step < 20; ++step) {
        std::vector<float> g(count);
        for (auto& x : g) x = static_cast<float>(static_cast<int>(rng() % 21) - 10);
        for (size_t i = 0; i < count; ++i) grad_sum[i] += g[i];
        U32 chosen;
        std::vector<float> sent = sparse_step(&r, g, k, &chosen);
        EXPECT(chosen.size() == std::min(k, num_chunks(count, chunk)));
        for (size_t i = 0; i < count; ++i) sent_sum[i] += sent[i];
        for (uint32_t c : chosen)  // sent chunks leave the residual
          for (size_t i = c * chunk; i < std::min((c + 1) * chunk, count); ++i)
            EXPECT(r.residual()[i] == 0.0f);
      }
      bool exact = true;  // integer-valued floats: the sums are exact
      for (size_t i = 0; i < count; ++i)
        exact = exact && (sent_sum[i] + r.residual()[i] == grad_sum[i]);
      EXPECT(exact);
      if (k == 0)
        for (size_t i = 0; i < count; ++i) EXPECT(r.residual()[i] == grad_sum[i]);
    }
  }
}

// absorb + commit are what the executor uses: they must give exactly what
// accumulate + importance + pack + clear_sent give, zero the gradient, and
// absorb alone (an overflow step: no commit) must leave the residual as it was.
static void test_absorb_commit_match_separate_calls() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float momentum : {0.0f, 0.9f}) {
    for (size_t count : {0u, 1u, 255u, 257u, 1000u, 5000u}) {
      const size_t chunk = 300;  // not a multiple of the 256-element block
      SparseResidual a(count, chunk, momentum), b(count, chunk, momentum);
      for (int step = 0; step < 6; ++step) {
        std::vector<float> g(count);
        for (auto& x : g) x = normal(rng);
        std::vector<float> g2 = g, imp_a, imp_b;
        const std::vector<float> before(b.residual(), b.residual() + count);
        b.absorb(g2.data(), &imp_b);
        EXPECT(std::equal(before.begin(), before.end(), b.residual()));  // not yet
        EXPECT(std::all_of(g2.begin(), g2.end(), [](float x) { return x == 0.0f; }));
        if (step == 2) continue;  // an overflow step: no commit, nothing changes
        a.accumulate(g.data());
        a.importance(&imp_a);
        EXPECT(imp_a == imp_b);
        U32 chosen = select_top_chunks(imp_a, 1 + step % 3);
        std::vector<float> pa(packed_size(chosen, count, chunk)), pb(pa.size());
        pack_chunks(a.residual(), count, chunk, chosen, pa.data());
        a.clear_sent(chosen);
        b.commit(chosen, pb.data());
        EXPECT(pa == pb);
        EXPECT(std::equal(a.residual(), a.residual() + count, b.residual()));
        // The L1 norm itself, against a double reference (no momentum: the
        // residual before sending is before + g).
        for (size_t c = 0; c < imp_b.size() && momentum == 0.0f; ++c) {
          double want = 0.0;
          for (size_t i = c * chunk; i < std::min((c + 1) * chunk, count); ++i)
            want += std::fabs(static_cast<double>(before[i]) + g[i]);
          EXPECT(std::fabs(imp_b[c] - want) <= 1e-5 * want + 1e-5);
        }
      }
    }
  }
  EXPECT(throws([] {  // chunks must be ascending; commit needs an absorb first
    SparseResidual r(10, 3, 0.0f);
    std::vector<float> g(10), p(6), imp;
    r.absorb(g.data(), &imp);
    r.commit({2, 1}, p.data());
  }));
  EXPECT(throws([] {
    SparseResidual r(10, 3, 0.0f);
    std::vector<float> p(6);
    r.commit({1}, p.data());
  }));
}

// An overflowed step: the output marks the non-finite chunks on every rank;
// the residual is whatever it was before (the executor never commits).
static void test_overflow_marking() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT(!any_non_finite({0.0f, 1e30f}));
  EXPECT(any_non_finite({0.0f, inf}) && any_non_finite({nan}));
  std::vector<float> out(10, 7.0f);
  mark_overflow({1.0f, inf, 2.0f, nan}, 10, 3, out.data());
  EXPECT(out[0] == 0 && out[2] == 0 && out[3] == inf && out[5] == inf && out[6] == 0);
  EXPECT(std::isnan(out[9]));
  SparseResidual r(4, 2, 0.5f);
  std::vector<float> g = {1, 2, inf, 4}, imp;
  r.absorb(g.data(), &imp);
  EXPECT(imp[0] == 3.0f && imp[1] == inf);
  EXPECT(r.residual()[0] == 0.0f && r.residual()[2] == 0.0f);
}

static void test_momentum_correction() {
  // One chunk of 2 never sent (k = 0), m = 0.5, grad = 1 every step:
  // velocity 1, 1.5, 1.75; residual 1, 2.5, 4.25.
  SparseResidual r(2, 2, 0.5f);
  std::vector<float> g = {1.0f, -2.0f};
  U32 chosen;
  sparse_step(&r, g, 0, &chosen);
  EXPECT(r.residual()[0] == 1.0f && r.residual()[1] == -2.0f);
  sparse_step(&r, g, 0, &chosen);
  EXPECT(r.residual()[0] == 2.5f && r.residual()[1] == -5.0f);
  sparse_step(&r, g, 0, &chosen);
  EXPECT(r.residual()[0] == 4.25f && r.residual()[1] == -8.5f);
  // Send it: residual and velocity restart, so the next step is plain grad.
  std::vector<float> sent = sparse_step(&r, g, 1, &chosen);
  // velocity 1.875 -> residual 6.125 sent.
  EXPECT(sent[0] == 6.125f && sent[1] == -12.25f);
  EXPECT(r.residual()[0] == 0.0f && r.residual()[1] == 0.0f);
  sparse_step(&r, g, 0, &chosen);
  EXPECT(r.residual()[0] == 1.0f && r.residual()[1] == -2.0f);

  // Two chunks: only the sent one has its velocity reset.
  SparseResidual r2(4, 2, 0.5f);
  std::vector<float> g2 = {4, 4, 1, 1};
  sparse_step(&r2, g2, 1, &chosen);  // chunk 0 sent; chunk 1 keeps residual 1, velocity 1
  EXPECT((chosen == U32{0}));
  EXPECT(r2.residual()[0] == 0.0f && r2.residual()[2] == 1.0f);
  std::vector<float> zero(4, 0.0f);
  sparse_step(&r2, zero, 0, &chosen);  // velocity: chunk0 0, chunk1 0.5
  EXPECT(r2.residual()[0] == 0.0f && r2.residual()[2] == 1.5f && r2.residual()[3] == 1.5f);

  EXPECT(throws([] { SparseResidual bad(4, 2, 1.0f); }));
  EXPECT(throws([] { SparseResidual bad(4, 2, -0.1f); }));
  EXPECT(throws([] { SparseResidual bad(4, 0, 0.0f); }));
}

// ---------------------------------------------------------------- fusion ---

static FusionItem item(size_t bytes, DataType dt = DataType::kFloat32, bool fusable = true) {
  return FusionItem{dt, ReduceOp::kSum, WireDtype::kNative, 1.0, 1.0, bytes, fusable};
}

static void test_plan_fusion() {
  EXPECT((plan_fusion({}, 100) == Sizes{}));
  // Fill up to the threshold exactly, then start a new group.
  EXPECT((plan_fusion({item(40), item(60), item(10)}, 100) == Sizes{2, 1}));
  EXPECT((plan_fusion({item(40), item(61), item(10)}, 100) == Sizes{1, 2}));
  // Threshold 0: fusion off.
  EXPECT((plan_fusion({item(1), item(1), item(1)}, 0) == Sizes{1, 1, 1}));
  // Oversized item alone, neighbours unaffected.
  EXPECT((plan_fusion({item(10), item(500), item(10), item(10)}, 100) == Sizes{1, 1, 2}));
  // Non-fusable items are alone even when small.
  EXPECT((plan_fusion({item(10), item(10, DataType::kFloat32, false), item(10)}, 100) ==
          Sizes{1, 1, 1}));
  // Any attribute change breaks a group; order is preserved (no regrouping).
  EXPECT((plan_fusion({item(10), item(10, DataType::kFloat64), item(10)}, 100) == Sizes{1, 1, 1}));
  auto op = item(10);
  op.op = ReduceOp::kMax;
  auto wire = item(10);
  wire.wire = WireDtype::kFloat16;
  auto pre = item(10);
  pre.prescale = 0.5;
  auto post = item(10);
  post.postscale = 0.25;
  EXPECT((plan_fusion({item(10), op, op, wire, pre, post, item(10)}, 100) ==
          Sizes{1, 2, 1, 1, 1, 1}));
  // Zero-byte items fuse; huge thresholds do not overflow.
  EXPECT((plan_fusion({item(0), item(0), item(5)}, 5) == Sizes{3}));
  EXPECT((plan_fusion({item(SIZE_MAX - 1), item(1), item(1)}, SIZE_MAX) == Sizes{2, 1}));
  // Group sizes always cover every item exactly once.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<FusionItem> items;
    size_t n = rng() % 30;
    for (size_t i = 0; i < n; ++i)
      items.push_back(item(rng() % 50, rng() % 4 ? DataType::kFloat32 : DataType::kInt32,
                           rng() % 8 != 0));
    size_t threshold = rng() % 120;
    Sizes groups = plan_fusion(items, threshold);
    size_t covered = 0;
    bool ok = true;
    for (size_t len : groups) {
      size_t bytes = 0;
      for (size_t j = covered; j < covered + len; ++j) bytes += items[j].bytes;
      if (len > 1) ok = ok && bytes <= threshold && threshold > 0;
      for (size_t j = covered + 1; j < covered + len; ++j)
        ok = ok && items[j].fusable && items[j].dtype == items[covered].dtype;
      if (len > 1) ok = ok && items[covered].fusable;
      covered += len;
    }
    EXPECT(ok && covered == n);
  }
}

static void test_fusion_buffer() {
  FusionBuffer fb;
  EXPECT(fb.bytes_copied() == 0 && fb.copies() == 0);
  float a[3] = {1, 2, 3}, b[2] = {4, 5};
  auto* base = static_cast<uint8_t*>(fb.reserve(sizeof(a) + sizeof(b)));
  fb.pack(0, a, sizeof(a));
  fb.pack(sizeof(a), b, sizeof(b));
  float view[5];
  std::memcpy(view, base, sizeof(view));
  EXPECT(view[0] == 1 && view[3] == 4 && view[4] == 5);
  reinterpret_cast<float*>(base)[4] = 50;  // "the collective" changes the buffer
  float a2[3], b2[2];
  fb.unpack(0, a2, sizeof(a2));
  fb.unpack(sizeof(a2), b2, sizeof(b2));
  EXPECT(a2[2] == 3 && b2[1] == 50);
  EXPECT(fb.copies() == 4 && fb.bytes_copied() == 2 * (sizeof(a) + sizeof(b)));
  // Grow-only: a smaller reserve keeps the allocation.
  EXPECT(fb.reserve(4) == base);
  fb.reserve(1 << 20);
  fb.pack(0, nullptr, 0);  // zero bytes: not counted
  EXPECT(fb.copies() == 4);
  EXPECT(throws([&] { fb.pack((1 << 20) - 2, a, sizeof(a)); }));
  EXPECT(throws([&] { fb.unpack(SIZE_MAX, a2, 4); }));
}

int main() {
  test_num_chunks();
  test_importance_short_last_chunk();
  test_select_ties_and_edges();
  test_select_matches_reference();
  test_pack_unpack_round_trip();
  test_residual_conservation();
  test_momentum_correction();
  test_absorb_commit_match_separate_calls();
  test_overflow_marking();
  test_plan_fusion();
  test_fusion_buffer();
  if (g_failures) {
    std::fprintf(stderr, "sparse_fusion_test: %d of %d checks FAILED\n", g_failures, g_checks);
    return 1;
  }
  std::printf("sparse_fusion_test: all %d checks passed\n", g_checks);
  return 0;
}
