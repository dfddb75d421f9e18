// csc_step_cost.cc — benchmark (plain main, no MPI): thread CPU time of one
// CSC step's local work per rank for the 25.2 M-parameter MLP's pool (13
// buckets of <= 8 MiB, chunk 32768, ratio 0.01), residual in the pool
// (sampled importance, output re-zero, take, unpack: Note [Residual in the
// pool]) against the classic SparseResidual (absorb, commit, unpack). No
// communication; thread CPU time, so the number holds on a loaded machine.
// Build: g++ -O3 -std=c++17 -Inative native/common.cc native/sparse_chunks.cc
//        native/sparse_pool_residual.cc native/tests/csc_step_cost.cc -o /tmp/csc_cost
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>
#include "sparse_chunks.h"
#include "sparse_pool_residual.h"
using namespace gradflow;
double cpu(){ timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  const size_t N = 25200000, B = 2097152, C = 32768; const double ratio = 0.01;
  std::vector<float> P(N), G(N);
  for (size_t i = 0; i < N; ++i) P[i] = std::sin(i * 0.001f);
  std::vector<std::unique_ptr<PoolResidual>> res;
  for (size_t o = 0; o < N; o += B) res.emplace_back(new PoolResidual(std::min(B, N - o), C));
  std::vector<double> ts, classic;
  for (int step = 0; step < 12; ++step) {
    for (size_t i = 0; i < N; i += 4096) P[i] += 1.0f;  // "backward" touches P a little
    double t = cpu();
    for (size_t b = 0, o = 0; o < N; ++b, o += B) {
      PoolResidual& r = *res[b]; float* p = P.data() + o; float* g = G.data() + o;
      std::vector<float> imp; sampled_chunk_importance(p, r.count(), C, &imp, r.next_phase());
      r.clear_output(g);
      size_t k = std::max<size_t>(1, std::min<size_t>(std::ceil(ratio * imp.size()), imp.size()));
      auto chosen = select_top_chunks(imp, k);
      std::vector<float> packed(packed_size(chosen, r.count(), C));
      r.take_chunks(p, chosen, packed.data());
      unpack_chunks(packed.data(), r.count(), C, chosen, g);
      r.set_written(chosen);
    }
    ts.push_back(cpu() - t);
  }
  // the classic step's local work on the same buffers, for comparison
  std::vector<std::unique_ptr<SparseResidual>> cres;
  for (size_t o = 0; o < N; o += B) cres.emplace_back(new SparseResidual(std::min(B, N - o), C, 0.f));
  for (int step = 0; step < 12; ++step) {
    double t = cpu();
    for (size_t b = 0, o = 0; o < N; ++b, o += B) {
      SparseResidual& r = *cres[b]; float* g = P.data() + o;
      std::vector<float> imp; r.absorb(g, &imp);
      size_t k = std::max<size_t>(1, std::min<size_t>(std::ceil(ratio * imp.size()), imp.size()));
      auto chosen = select_top_chunks(imp, k);
      std::vector<float> packed(packed_size(chosen, r.count(), C));
      r.commit(chosen, packed.data());
      unpack_chunks(packed.data(), r.count(), C, chosen, g);
    }
    classic.push_back(cpu() - t);
    for (size_t i = 0; i < N; i += 4096) P[i] += 1.0f;
  }
  ts.erase(ts.begin(), ts.begin() + 2); classic.erase(classic.begin(), classic.begin() + 2);
  std::sort(ts.begin(), ts.end()); std::sort(classic.begin(), classic.end());
  std::printf("thread CPU per step, median of 10: residual in pool %.2f ms (min %.2f), classic %.2f ms (min %.2f)\n",
              ts[5] * 1e3, ts[0] * 1e3, classic[5] * 1e3, classic[0] * 1e3);
}
