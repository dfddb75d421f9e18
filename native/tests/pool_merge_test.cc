// pool_merge_test.cc — unit tests (plain main, no MPI) for pool_merge: the
// bucket-name parser (plain and autotune re-cut names) and which agreed
// responses merge_adjacent_pool_buckets joins. Exit code != 0 on failure.
// Build: g++ -O2 -std=c++17 -Inative native/pool_merge.cc
//        native/tests/pool_merge_test.cc -o /tmp/pm
#include <cstdio>
#include <string>
#include <vector>

#include "pool_merge.h"

using namespace gradflow;

static int g_failures = 0;

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      ++g_failures;                                                                   \
      std::fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                                 \
  } while (0)

static Response bucket(const std::string& name, double sparse_ratio = 1.0) {
  Response r;
  r.name = name;
  r.in_pool = true;
  r.sparse_ratio = sparse_ratio;
  return r;
}

static std::vector<size_t> ones(size_t n) { return std::vector<size_t>(n, 1); }

int main() {
  long p = -1, c = -1, b = -1;
  EXPECT(parse_pool_bucket_name("gradflow.pool3.bucket12", &p, &c, &b) && p == 3 && c == 0 &&
         b == 12);
  EXPECT(parse_pool_bucket_name("gradflow.pool0.cut2.bucket5", &p, &c, &b) && p == 0 && c == 2 &&
         b == 5);
  EXPECT(!parse_pool_bucket_name("gradflow.pool.bucket1", &p, &c, &b));
  EXPECT(!parse_pool_bucket_name("gradflow.pool1.cut.bucket1", &p, &c, &b));
  EXPECT(!parse_pool_bucket_name("gradflow.pool1.bucket", &p, &c, &b));
  EXPECT(!parse_pool_bucket_name("gradflow.pool1.bucket2x", &p, &c, &b));
  EXPECT(!parse_pool_bucket_name("grad.w", &p, &c, &b));

  // b, b+1, b+2 of one pool: one group; a gap or another pool starts anew.
  std::vector<Response> rs = {bucket("gradflow.pool0.bucket0"), bucket("gradflow.pool0.bucket1"),
                              bucket("gradflow.pool0.bucket2"), bucket("gradflow.pool0.bucket4"),
                              bucket("gradflow.pool1.bucket5")};
  EXPECT((merge_adjacent_pool_buckets(rs, ones(rs.size())) == std::vector<size_t>{3, 1, 1}));

  // Re-cut buckets merge among themselves, never with another cut's.
  rs = {bucket("gradflow.pool0.cut1.bucket0"), bucket("gradflow.pool0.cut1.bucket1"),
        bucket("gradflow.pool0.cut2.bucket2"), bucket("gradflow.pool0.cut2.bucket3")};
  EXPECT((merge_adjacent_pool_buckets(rs, ones(rs.size())) == std::vector<size_t>{2, 2}));
  rs = {bucket("gradflow.pool0.bucket0"), bucket("gradflow.pool0.cut1.bucket1")};
  EXPECT((merge_adjacent_pool_buckets(rs, ones(rs.size())) == std::vector<size_t>{1, 1}));

  // CSC buckets, differing wire or scales, errors and fused groups stay apart.
  rs = {bucket("gradflow.pool0.bucket0"), bucket("gradflow.pool0.bucket1", 0.01)};
  EXPECT((merge_adjacent_pool_buckets(rs, ones(2)) == std::vector<size_t>{1, 1}));
  rs = {bucket("gradflow.pool0.bucket0"), bucket("gradflow.pool0.bucket1")};
  rs[1].wire = WireDtype::kFloat16;
  EXPECT((merge_adjacent_pool_buckets(rs, ones(2)) == std::vector<size_t>{1, 1}));
  rs[1].wire = rs[0].wire;
  rs[1].postscale = 0.5;
  EXPECT((merge_adjacent_pool_buckets(rs, ones(2)) == std::vector<size_t>{1, 1}));
  rs[1].postscale = 1.0;
  rs[1].error = "refused";
  EXPECT((merge_adjacent_pool_buckets(rs, ones(2)) == std::vector<size_t>{1, 1}));
  rs = {bucket("a"), bucket("b"), bucket("gradflow.pool0.bucket0"), bucket("gradflow.pool0.bucket1")};
  EXPECT((merge_adjacent_pool_buckets(rs, {2, 1, 1}) == std::vector<size_t>{2, 2}));

  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("pool_merge: all checks passed\n");
  return 0;
}
