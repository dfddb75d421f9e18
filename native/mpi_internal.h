// mpi_internal.h — helpers shared by the transport files that include mpi.h
// (mpi_comm.cc: communicator, waits, control collectives;
// mpi_data_collectives.cc: bcast / allgatherv / alltoallv; rma_window.cc:
// one-sided windows). Never included by algorithm or binding code.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <memory>
#include <string>

#include "mpi_comm.h"

namespace gradflow {

// Largest count handed to one MPI call. Overridable at build time so tests can
// exercise the chunked (> INT_MAX) paths with small buffers.
#ifndef GRADFLOW_MAX_MPI_COUNT
#define GRADFLOW_MAX_MPI_COUNT (size_t{1} << 30)
#endif
inline constexpr size_t kMaxCount = GRADFLOW_MAX_MPI_COUNT;
static_assert(kMaxCount <= size_t{INT_MAX}, "MPI counts are int");

inline bool mpi_finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

// Turns an MPI error code into a TransportError naming the call and the
// operation it served.
inline void mpi_check(int rc, const char* call, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(std::string("gradflow: ") + call + " failed in " + what + ": " +
                      std::string(text, static_cast<size_t>(len)));
}

// What MpiComm hides from its header: the MPI communicator itself.
struct MpiComm::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  void iallreduce(MpiComm& self, void* buf, size_t count, size_t elem_bytes, MPI_Datatype t,
                  MPI_Op op, const char* what, WaitStyle style);
  std::chrono::steady_clock::time_point deadline(double timeout_s) const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(timeout_s));
  }
};

// A window of `bytes` on `comm` (collective over comm; see rma_window.cc).
// `owner` provides the deadline barrier used by RmaWindow::sync.
std::unique_ptr<RmaWindow> make_mpi_window(MpiComm& owner, MPI_Comm comm, size_t bytes,
                                           bool shared);

}  // namespace gradflow
