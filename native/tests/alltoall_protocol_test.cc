// alltoall_protocol_test.cc — SPMD regression test: alltoall picks MPI's
// alltoallv or the point-to-point fallback from the agreed splits matrix,
// never from one rank's own totals (ranks posting different protocols time
// out). Build with a tiny -DGRADFLOW_MAX_MPI_COUNT=64 so that rank 0's
// totals are past the limit and the other ranks' are not; run under mpiexec
// at N = 2..4 (tests/single/test_native_drivers.py does both).
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "collectives.h"
#include "mpi_comm.h"

using namespace gradflow;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int fail = 0;
  {
    MpiComm c(0, 10.0);  // a protocol mismatch ends in a timeout, not a hang
    const int N = c.size(), R = c.rank();
    // Rank 0 keeps 40 rows for itself (160 bytes > 64); every other block is
    // one row, so the other ranks' totals (4 * N bytes) fit the limit.
    std::vector<int64_t> splits(N * N, 1);
    splits[0] = 40;
    std::vector<int32_t> in, out;
    for (int d = 0; d < N; ++d)
      for (int64_t k = 0; k < splits[R * N + d]; ++k) in.push_back(R * 1000 + d * 100 + k);
    int64_t rows = 0;
    for (int s = 0; s < N; ++s) rows += splits[s * N + R];
    out.assign(rows, -1);
    try {
      alltoall(c, in.data(), out.data(), splits, 1, DataType::kInt32, nullptr);
      size_t i = 0;
      for (int s = 0; s < N; ++s)
        for (int64_t k = 0; k < splits[s * N + R]; ++k, ++i)
          if (out[i] != s * 1000 + R * 100 + k) ++fail;
      if (fail) std::fprintf(stderr, "[rank %d] FAIL: %d wrong elements\n", R, fail);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] FAIL: %s\n", R, e.what());
      fail = 1;
    }
    int any = 0;
    MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (R == 0 && !any) std::printf("ALL PASSED on %d ranks\n", N);
    fail = any;
  }
  if (fail) MPI_Abort(MPI_COMM_WORLD, 1);  // a rank stuck in a mismatched protocol
  MPI_Finalize();
  return fail;
}
