// response_executor.h — runs agreed responses on this rank: fuses
// allreduces (fusion_buffer), picks the algorithm (ring / two-sync / MPI;
// Adasum for op=Adasum),
// applies coarse-grained sparse communication and scaling, and runs the
// other collectives. Owns per-communicator algorithm state (RMA windows,
// sparse residuals, scratch). Called only from the background thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "adasum_allreduce.h"
#include "collectives.h"
#include "config.h"
#include "fusion_buffer.h"
#include "message.h"
#include "mpi_comm.h"
#include "ring_allreduce.h"
#include "sparse_auto_policy.h"
#include "sparse_chunks.h"
#include "stats.h"
#include "tensor_queue.h"
#include "two_sync_allreduce.h"

namespace gradflow {

class ResponseExecutor {
 public:
  ResponseExecutor(MpiComm& comm, const Config& cfg, Stats& stats);
  ~ResponseExecutor();

  // Fusion plan for a response list (pure function of the list and the
  // config, so the same on every rank): sizes of consecutive groups. Pool
  // buckets are never fused through the buffer; adjacent dense ones of one
  // pool form one group when GRADFLOW_POOL_MERGE is on (pool_merge.h).
  std::vector<size_t> plan(const std::vector<Response>& responses) const;

  // Runs one group from plan(). `entries[i]` is this rank's entry for
  // group[i], or nullptr if this rank has joined (it contributes zeros).
  // Fills one result per response.
  void run_group(const std::vector<const Response*>& group, const std::vector<TensorEntry*>& entries,
                 std::vector<HandleResult>* results);

  // Which algorithm an allreduce of `bytes` would use (for stats/timeline).
  AllreduceAlgo choose_algo(size_t bytes, DataType dt) const;

  // What the last run_group did, for the timeline.
  struct LastRun {
    AllreduceAlgo algo = AllreduceAlgo::kRing;
    WireDtype wire = WireDtype::kNative;
    TransferStats transfer;
    bool sparse = false;
  };
  const LastRun& last_run() const { return last_; }

  // An agreed autotune decision (tuning.h): algorithm and ring piece size
  // for every allreduce run after this call.
  void set_tuning(AllreduceAlgo algo, int64_t ring_pipeline_bytes) {
    cfg_.allreduce_algo = algo;
    cfg_.ring_pipeline_bytes = ring_pipeline_bytes;
  }

  // Frees the RMA windows (collective: every rank's loop calls it in the
  // cycle they agreed to stop in; see BackgroundLoop::run).
  void release_windows() { two_sync_.reset(); }

 private:
  // Allreduce of a contiguous buffer (dense), any algorithm: in place, or
  // of `input` into `buf` (the ring reads it directly, Note
  // [Out-of-place ring] in ring_allreduce.cc; the other algorithms copy it
  // into `buf` first).
  void allreduce_dense(void* buf, size_t count, DataType dt, ReduceOp op, WireDtype wire,
                       TransferStats* ts, const void* input = nullptr);
  // Coarse-grained sparse allreduce of a float32 buffer with error feedback
  // in `res` (see sparse_chunks.h), result multiplied by `postscale`
  // (applied to the sent chunks only: every other element of the result is
  // zero, and a pass over them would cost as much memory traffic as half of
  // CSC itself).
  // `policy` (null unless GRADFLOW_SPARSE_POLICY=auto) may send the whole
  // buffer, residual included, dense (Note [Auto sparse policy]).
  void allreduce_sparse(SparseResidual* res, float* buf, ReduceOp op, WireDtype wire,
                        double ratio, double postscale, TransferStats* ts,
                        SparseAutoPolicy* policy);
  // The same for a pool bucket whose residual is the pool itself (Note
  // [Residual in the pool], sparse_pool_residual.cc): reads the entry's
  // input P, leaves the result in its output G.
  void allreduce_pool_residual(const Response& r, TensorEntry* e, TransferStats* ts);
  // The two steps both CSC paths share (executor_sparse.cc); `t0` starts
  // the CPU-time span each one closes into *cpu_seconds.
  // Step 1's agreement: the per-rank importance (with the auto policy's cost
  // entries appended) is summed over ranks and the policy decides from the
  // sum, so every rank decides the same.
  struct ImportanceAgreement {
    bool dense = false;       // the auto policy sends the whole bucket dense
    double transfer_s = 0.0;  // the importance allreduce's transfer time
    double agreed_at = 0.0;   // now_seconds() once agreed
  };
  ImportanceAgreement agree_on_importance(std::vector<float>* importance,
                                          SparseAutoPolicy* policy, double t0,
                                          double* cpu_seconds, TransferStats* ts);
  // Step 3's collective: the packed chosen chunks are reduced densely,
  // multiplied by `postscale` and unpacked into `dst` (count elements of
  // `chunk`-element chunks). Returns the transfer time.
  double reduce_chosen_chunks(std::vector<float>* packed, const std::vector<uint32_t>& chosen,
                              size_t count, size_t chunk, ReduceOp op, WireDtype wire,
                              double postscale, float* dst, double t0, double* cpu_seconds,
                              TransferStats* ts);
  // The residual a sparse response uses: its pool's (via the entry), a zero
  // one for a joined rank, or the per-name one. Sets *error (and returns
  // null) if a name's size changed.
  SparseResidual* sparse_residual(const Response& r, TensorEntry* e, size_t count,
                                  std::unique_ptr<SparseResidual>* temp, std::string* error);
  // The auto sparse policy of a response's bucket (kept per name, shared by
  // the in-pool and the classic step so a joined rank decides alike), or
  // null under GRADFLOW_SPARSE_POLICY=always.
  SparseAutoPolicy* auto_policy(const Response& r, size_t count);
  // True if this step of a named sparse allreduce is a dense warm-up step.
  bool sparse_warmup(const Response& r);
  // Adjacent dense pool buckets joined by the plan (pool_merge.h): one
  // in-place collective over their contiguous union (executor_pool_merge.cc).
  void run_pool_merged(const std::vector<const Response*>& group,
                       const std::vector<TensorEntry*>& entries, std::vector<HandleResult>* results);
  void run_allreduces(const std::vector<const Response*>& group,
                      const std::vector<TensorEntry*>& entries, std::vector<HandleResult>* results);
  void run_other(const Response& r, TensorEntry* entry, HandleResult* result);
  void record(const char* kind, AllreduceAlgo algo, WireDtype wire, const TransferStats& ts);

  struct SparseState {
    std::unique_ptr<SparseResidual> residual;
    int64_t steps = 0;
    std::unique_ptr<SparseAutoPolicy> policy;
  };

  MpiComm& comm_;
  Config cfg_;
  Stats& stats_;
  FusionBuffer fusion_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> zeros_;  // a joined rank's stand-in input
  std::unique_ptr<TwoSyncAllreduce> two_sync_;
  AdasumAllreduce adasum_;
  std::map<std::string, SparseState> sparse_;
  LastRun last_;
};

}  // namespace gradflow
