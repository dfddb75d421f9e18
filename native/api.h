// api.h — the framework-agnostic C++ API. Runtime is the engine of one
// communicator: it owns the communicator, configuration, submit queue,
// background loop, gradient pools and stats. init() creates the global one,
// which also owns the process-set table (process_sets.h); each process set
// this rank belongs to has a Runtime of its own. Bindings call only this.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "background_loop.h"
#include "config.h"
#include "grad_pool.h"
#include "mpi_comm.h"
#include "process_sets.h"
#include "sparse_chunks.h"
#include "sparse_pool_residual.h"
#include "stats.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace gradflow {

// Everything a binding passes to submit one collective. Buffers are raw
// addresses of caller-owned memory (numpy, torch, ...), alive until the
// handle completes.
struct SubmitArgs {
  OpKind kind = OpKind::kAllreduce;
  std::string name;
  uintptr_t input = 0;
  uintptr_t output = 0;  // allreduce / broadcast: result buffer (may equal input)
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int wire = -1;              // WireDtype, or -1 for GRADFLOW_WIRE_DTYPE
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> splits;  // alltoall
  double sparse_ratio = -1.0;   // < 0: GRADFLOW_SPARSE_RATIO
  bool in_pool = false;         // a gradient-pool bucket: in place, never fused
  std::string step_tag;         // Request::step_tag (allreduce only)
  int group_size = 0;           // Request::group_size (Note [Grouped lists])
  bool rollback_residual = false;  // TensorEntry::rollback_residual
  std::shared_ptr<SparseResidual> sparse_residual;  // a sparse pool bucket's (owned by the pool)
  std::shared_ptr<PoolResidual> pool_residual;  // or its in-pool residual's (output != input)
};

class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  // The global engine (process_set_id 0) on the user's communicator; or a
  // process set's engine (Note [Process sets]) on a communicator of
  // `set_ranks` (global ranks), told through `on_fatal` when it dies.
  Runtime(uintptr_t comm_handle, const std::map<std::string, std::string>& overrides,
          int process_set_id = 0, std::vector<int> set_ranks = {},
          std::function<void(const std::string&)> on_fatal = nullptr,
          std::shared_ptr<EngineLinks> links = nullptr);
  ~Runtime();

  int process_set_id() const { return set_id_; }
  const std::vector<int>& set_ranks() const { return set_ranks_; }  // global ranks
  // What the process's engines share (engine_links.h): the global engine
  // makes it, set engines get it at creation.
  std::shared_ptr<EngineLinks> engine_links() const { return links_; }
  int64_t generation() const { return generation_; }
  // `message` as this engine reports it: a set's engine names the set (and,
  // for `set_relative` messages of its coordinator, how it numbers ranks).
  std::string in_set(const std::string& message, bool set_relative = false) const;
  // The process-set registry (the global engine only).
  ProcessSetTable& process_sets();

  const MpiComm& comm() const { return *comm_; }
  const Config& config() const { return cfg_; }
  Stats& stats() { return stats_; }
  Timeline& timeline() { return links_->timeline; }  // shared by the process's engines

  int64_t submit(const SubmitArgs& args);  // validates early, returns a handle
  // submit()'s checks without submitting (a grouped op checks every member
  // before it submits any: gradflow/_runtime.py submitting_group).
  void check(const SubmitArgs& args);
  // This rank failed between naming collective `name` and submitting it:
  // tell the other ranks, which fail it with `reason` (Note [Withdrawn
  // names] in coordinator.h). False if nothing was sent: the name is in
  // flight here (it was submitted after all) or the runtime is closed.
  bool withdraw(OpKind kind, const std::string& name, int32_t group_size,
                const std::string& reason);
  bool poll(int64_t handle);
  std::optional<HandleResult> wait(int64_t handle,
                                   const std::function<bool()>& interrupted = nullptr);  // blocks; callers release the GIL
  // Note [Handle lifetime] in tensor_queue.h: the caller dropped `handle`.
  bool release(int64_t handle) { return queue_.release(handle); }
  std::vector<int64_t> take_reaped() { return queue_.take_reaped(); }
  // Stops the loop (every pending handle completes with an error) and frees
  // the communicator. Waiters may still hold the object: only the queue is
  // used after this (submit then raises).
  // `reason` (a set engine's removal): what its pending collectives fail
  // with instead of "shutdown() was called".
  void shutdown(const std::string& reason = "");
  // The global engine's abort reaches every set engine too.
  void abort(const std::string& message);
  // The global engine's answer covers its set engines.
  bool failed_fatally();
  // A peer is known dead (interrupt_waits): an engine whose loop thread is
  // inside an MPI call without deadline fails now instead of never (Note
  // [Blocking MPI calls], mpi_comm.h). Covers the set engines.
  void give_up_blocked_calls();
  // Some engine's loop thread was given up: it may still run inside MPI, so
  // this object must never be destroyed (the shutdown binding keeps it).
  bool abandoned();
  // False in a fork() child: the loop thread and the MPI state belong to the
  // parent, so the child must not use (or destroy) this runtime.
  bool owned_by_this_process() const;
  // A handle of this engine is in flight or holds an unwaited result.
  bool holds_handles() const { return queue_.holds_handles(); }

  // Gradient pools (lazy allreduce); see grad_pool.h. Pool ids are unique in
  // the process: a runtime's generation in the high 32 bits, its pool index
  // (which names the buckets, the same on every rank) in the low bits, so an
  // id from before shutdown() + init() is refused, never taken for a new pool.
  // `output` != 0 (sparse float32 pools, no sparse momentum): the residual
  // is the pool buffer itself and results go to `output`, a second buffer
  // of the same size (Note [Residual in the pool], sparse_pool_residual.cc).
  int64_t pool_create(uintptr_t data, DataType dt, const std::vector<int64_t>& range_elems,
                      int64_t bucket_bytes, ReduceOp op, int wire, double prescale,
                      double postscale, double sparse_ratio, uintptr_t output = 0);
  int64_t pool_mark_ready(int64_t pool, int64_t range);  // handle, or -1 if no bucket completed
  std::vector<int64_t> pool_flush(int64_t pool);         // handles of the remaining buckets
  void pool_reset(int64_t pool);  // ends a step (counts it towards the sparse warm-up)
  // Scales for the buckets submitted from now on (the torch binding divides
  // by the AMP loss scale here so a sparse pool's residual stays unscaled).
  void pool_set_scale(int64_t pool, double prescale, double postscale);
  // Step tag (Note [Step tags]) of the buckets submitted from now on; "" for none.
  void pool_set_step_tag(int64_t pool, const std::string& tag);
  // Something other than the core wrote into a residual-in-pool pool's
  // output since its last step: the next step zeroes all of it first.
  void pool_output_dirty(int64_t pool);
  // Classic CSC pools (not residual-in-pool): every bucket's residual back to
  // before the last step (SparseResidual::rollback). Called between steps.
  void pool_rollback_residuals(int64_t pool);
  // Frees its sparse residuals once no bucket is in flight; ids of other
  // runtimes are ignored.
  void pool_destroy(int64_t pool);
  std::vector<int64_t> pool_bucket_offsets(int64_t pool);  // element offset of each bucket
  // Names of the buckets not submitted this step (the core's names, so a
  // failed step can withdraw them without rebuilding them in Python).
  std::vector<std::string> pool_open_bucket_names(int64_t pool);
  // Autotune: cuts the pool's buckets anew for `bucket_bytes`, between steps
  // (after pool_reset, nothing of it in flight). Every rank must call it at
  // the same step with the same value (gradflow/autotune.py takes it from
  // rank 0's broadcast). A residual-in-pool pool keeps its residual (it is
  // the pool) and zeroes all of its output next step; a pool with separate
  // per-bucket residuals (GRADFLOW_SPARSE_MOMENTUM) is refused.
  void pool_rebucket(int64_t pool, int64_t bucket_bytes);

 private:
  struct PoolState {
    std::unique_ptr<GradPool> pool;
    SubmitArgs bucket_template;
    int64_t steps = 0;  // pool_reset calls: dense while < GRADFLOW_SPARSE_WARMUP_STEPS
    std::vector<std::shared_ptr<SparseResidual>> residuals;  // per bucket, if sparse
    std::vector<std::shared_ptr<PoolResidual>> pool_residuals;  // instead, residual in the pool
    uint8_t* output = nullptr;  // the results' buffer when the residual is in the pool
  };
  int64_t submit_bucket(PoolState& p, int bucket);
  PoolState& find_pool(int64_t id);  // caller holds pools_mu_
  // Every rank's settings must agree; a rank whose GRADFLOW_* values did not
  // parse (config_error_) still takes part, so every rank raises its message
  // at once instead of waiting out the init timeout.
  void check_config_matches_everywhere();
  void validate_submit(const SubmitArgs& args) const;  // throws InvalidArgumentError
  SubmitArgs for_set(const SubmitArgs& args) const;    // a set engine's view (broadcast root)
  int64_t in_set_errors(const std::function<int64_t()>& f) const;  // errors name the set
  int64_t submit_checked(const SubmitArgs& args);
  int set_rank_of(int global_rank) const;  // -1 if not a member
  // f on this engine's loop, then (global engine) on each set engine's,
  // until it returns true: failed_fatally, abandoned, give_up_blocked_calls.
  bool any_loop(const std::function<bool(BackgroundLoop&)>& f);

  std::string config_error_;  // set before cfg_ is initialised (declared first)
  Config cfg_;
  std::unique_ptr<MpiComm> comm_;
  Stats stats_;
  TensorQueue queue_;
  std::unique_ptr<BackgroundLoop> loop_;
  std::mutex pools_mu_;
  std::map<int64_t, PoolState> pools_;  // by pool id
  int next_pool_ = 0;
  int64_t generation_ = 0;  // this runtime's number in the process (from 1)
  int64_t pid_ = 0;         // the process that created it
  std::mutex shutdown_mu_;
  int set_id_ = 0;
  std::vector<int> set_ranks_;
  std::shared_ptr<EngineLinks> links_;
  std::unique_ptr<ProcessSetTable> sets_;  // global engine only
};

}  // namespace gradflow
