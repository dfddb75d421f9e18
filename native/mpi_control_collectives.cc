// mpi_control_collectives.cc — MpiComm's small collectives: barrier, the
// in-place allreduces (negotiation's bit vector, maxima, the mpi algorithm's
// builtin allreduce), negotiation's broadcast and the point-to-point gather to
// the root. Each polls its nonblocking MPI call with the deadline; the control
// ones run on a ControlCopy (Note [Abandoned operations], mpi_internal.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "mpi_internal.h"

namespace gradflow {

namespace {

// MPI's own type and operation for allreduce_builtin.
MPI_Datatype mpi_type(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kBool: return MPI_UINT8_T;  // 0/1 bytes; min = and, max = or
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    default: break;
  }
  throw GradflowError(std::string("gradflow: MPI_Allreduce has no builtin type for ") +
                      dtype_name(dt) + "; use the ring or two-sync algorithm");
}

MPI_Op mpi_op(ReduceOp op, DataType dt) {
  GF_CHECK(dt != DataType::kBool || op == ReduceOp::kMin || op == ReduceOp::kMax,
           "gradflow: bool supports only min/max, not " << reduce_op_name(op));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;  // the caller divides
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kAdasum: break;  // not element-wise (adasum_allreduce.h)
  }
  throw GradflowError("gradflow: unknown reduce op");
}

}  // namespace

void MpiComm::barrier(const char* what, WaitStyle style) {
  MPI_Request r;
  mpi_check(MPI_Ibarrier(impl_->comm, &r), "MPI_Ibarrier", what);
  wait_request(&r, what, -1, style);
}

// In-place MPI_Iallreduce in chunks of kMaxCount elements, each polled.
// Control collectives (kControl) run on a ControlCopy (Note [Abandoned
// operations], mpi_internal.h).
void MpiComm::Impl::iallreduce(MpiComm& self, void* buf, size_t count, size_t elem_bytes,
                               MPI_Datatype t, MPI_Op op, const char* what, WaitStyle style) {
  for (size_t done = 0; done < count; done += kMaxCount) {
    const size_t n = std::min(kMaxCount, count - done);
    char* chunk = static_cast<char*>(buf) + done * elem_bytes;
    std::unique_ptr<ControlCopy> copy;
    if (style == WaitStyle::kControl) copy = std::make_unique<ControlCopy>(chunk, n * elem_bytes);
    MPI_Request r;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, copy ? copy->get() : static_cast<void*>(chunk),
                             static_cast<int>(n), t, op, comm, &r),
              "MPI_Iallreduce", what);
    try {
      self.wait_request(&r, what, -1, style);
    } catch (...) {
      (void)copy.release();  // MPI may still write it
      throw;
    }
    if (copy) copy->commit();
  }
}

void MpiComm::allreduce_band(uint64_t* words, size_t n, const char* what) {
  impl_->iallreduce(*this, words, n, 8, MPI_UINT64_T, MPI_BAND, what, WaitStyle::kControl);
}

void MpiComm::allreduce_max_i64(int64_t* values, size_t n, const char* what) {
  impl_->iallreduce(*this, values, n, 8, MPI_INT64_T, MPI_MAX, what, WaitStyle::kControl);
}

void MpiComm::allreduce_builtin(void* buf, size_t count, DataType dt, ReduceOp op,
                                const char* what) {
  impl_->iallreduce(*this, buf, count, dtype_size(dt), mpi_type(dt), mpi_op(op, dt), what,
                    WaitStyle::kData);
}

// Negotiation's broadcast: the size, then the bytes, each on a ControlCopy
// (Note [Abandoned operations]).
void MpiComm::bcast_vector(std::vector<uint8_t>& data, int root, const char* what) {
  auto ibcast = [&](void* dst, size_t bytes, WaitStyle style) {
    auto copy = std::make_unique<ControlCopy>(dst, bytes);
    MPI_Request r;
    mpi_check(MPI_Ibcast(copy->get(), static_cast<int>(bytes), MPI_BYTE, root, impl_->comm, &r),
              "MPI_Ibcast", what);
    try {
      wait_request(&r, what, root, style);
    } catch (...) {
      (void)copy.release();  // MPI may still write it
      throw;
    }
    copy->commit();
  };
  uint64_t n = data.size();
  ibcast(&n, sizeof n, WaitStyle::kControl);
  if (rank_ != root) data.resize(n);
  for (size_t done = 0; done < n; done += kMaxCount)
    ibcast(data.data() + done, std::min(kMaxCount, static_cast<size_t>(n) - done), WaitStyle::kData);
}

// Point-to-point rather than MPI_Igatherv so that, when the deadline passes,
// the root knows exactly which ranks' messages are missing. The root matches
// each peer's message with MPI_Improbe (learning its size) and MPI_Imrecv.
std::vector<std::vector<uint8_t>> MpiComm::gather_to_root(const std::vector<uint8_t>& mine,
                                                          int root, const char* what) {
  std::vector<std::vector<uint8_t>> out;
  if (rank_ != root) {
    // A freed send request still reads its buffer: a copy MPI may keep
    // (Note [Abandoned operations]).
    auto copy = std::make_unique<std::vector<uint8_t>>(mine);
    RequestList reqs;
    isend(copy->data(), copy->size(), root, kTagGather, reqs);
    try {
      wait_all(reqs, what, WaitStyle::kControl);
    } catch (...) {
      (void)copy.release();
      throw;
    }
    return out;
  }
  out.resize(size_);
  out[root] = mine;
  std::vector<MPI_Request> reqs(size_, MPI_REQUEST_NULL);
  std::vector<char> matched(size_, 0), done(size_, 0);
  done[root] = matched[root] = 1;
  int rc = MPI_SUCCESS;
  bool ok = poll_until(impl_->deadline(timeout_s_), WaitStyle::kControl, [&] {
    bool all = true;
    for (int p = 0; p < size_ && rc == MPI_SUCCESS; ++p) {
      if (done[p]) continue;
      int flag = 0, n = 0;
      if (!matched[p]) {
        MPI_Message msg;
        MPI_Status st;
        rc = MPI_Improbe(p, kTagGather, impl_->comm, &flag, &msg, &st);
        if (rc == MPI_SUCCESS && flag) {
          MPI_Get_count(&st, MPI_BYTE, &n);
          out[p].resize(static_cast<size_t>(n));
          rc = MPI_Imrecv(out[p].data(), n, MPI_BYTE, &msg, &reqs[p]);
          matched[p] = 1;
        }
      }
      if (matched[p] && rc == MPI_SUCCESS) rc = MPI_Test(&reqs[p], &flag, MPI_STATUS_IGNORE);
      done[p] = matched[p] && flag;
      all = all && done[p];
    }
    return all || rc != MPI_SUCCESS;
  });
  if (rc != MPI_SUCCESS || !ok) {
    std::vector<int> missing;
    for (int p = 0; p < size_; ++p) {
      if (!done[p]) missing.push_back(p);
      if (reqs[p] != MPI_REQUEST_NULL) {  // matched: data in flight, into a buffer kept for MPI
        MPI_Request_free(&reqs[p]);
        (void)new std::vector<uint8_t>(std::move(out[p]));  // Note [Abandoned operations]
      }
    }
    mark_broken();
    mpi_check(rc, "MPI_Improbe/MPI_Imrecv", what);
    throw TransportError(timeout_message(timeout_s_, what, rank_list(missing)));
  }
  return out;
}

}  // namespace gradflow
