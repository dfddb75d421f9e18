// api.cc — Runtime: start-up checks, early validation of submissions, the
// process-set wording of errors. No communication logic beyond start-up.
// The gradient-pool methods are in api_pools.cc.
#include "api.h"
#include "log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <sstream>

#include "adasum_allreduce.h"
#include "config_check.h"
#include "reduce_kernels.h"

namespace gradflow {

namespace {
std::atomic<int64_t> g_generations{0};

// The settings, or (when a value does not parse) the defaults, with the
// error kept for check_config_matches_everywhere to report on every rank.
Config load_config_or_defaults(const std::map<std::string, std::string>& overrides,
                               std::string* error) {
  try {
    return load_config(overrides);
  } catch (const GradflowError& e) {
    *error = e.what();
    return Config{};
  }
}

// Note [CSC sums only]: CSC keeps what a rank did not send as an error-feedback
// residual and adds it to the next call's input, and the receivers treat the
// chunks not sent as zeros. That is exact bookkeeping for a sum (and an
// average); for min, max and product it returned zeros for every chunk not
// sent and fed a running sum back into a min (helper-17's audit: with
// GRADFLOW_SPARSE_RATIO set for the gradients, a plain allreduce(op=Max) of
// metrics came back mostly zeros, alike on every rank). So the default ratio
// does not apply to them and an explicit one is refused.
bool csc_reduces(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAverage; }

// Note [Global failures in a set]: a dead global engine fails every set
// engine with its own text (abort_sets), which counts GLOBAL ranks, while a
// set engine's own texts count its members (in_set's note says so). Relayed
// as they were, set [0, 2] waiting when global rank 1 raised read "process
// set 1 (ranks [0, 2]; 'rank i' ... count its members): aborting because
// rank 0 failed: gradflow: aborting because rank 1 failed: ValueError ...",
// its rank 1 (global) read as member 1, global rank 2. So the global text
// carries this marker through the set's engines (a member's set coordinator
// relays it to the others inside its "aborting because rank i failed"), and
// in_set words the text from the marker on, without the members' note.
constexpr char kGlobalFailure[] = "the job failed ('rank i' below is a global rank): ";

std::string as_global_failure(const std::string& why) {
  const std::string prefix = "gradflow: ";
  return kGlobalFailure +
         (why.compare(0, prefix.size(), prefix) == 0 ? why.substr(prefix.size()) : why);
}
}  // namespace

Runtime::Runtime(uintptr_t comm_handle, const std::map<std::string, std::string>& overrides,
                 int process_set_id, std::vector<int> set_ranks,
                 std::function<void(const std::string&)> on_fatal,
                 std::shared_ptr<EngineLinks> links)
    : cfg_(load_config_or_defaults(overrides, &config_error_)),
      generation_(++g_generations),
      pid_(::getpid()),
      set_id_(process_set_id),
      set_ranks_(std::move(set_ranks)),
      links_(std::move(links)) {
  set_log_level(parse_log_level(cfg_.log_level));
  comm_ = std::make_unique<MpiComm>(comm_handle, cfg_.timeout_seconds);
  check_config_matches_everywhere();
  if (set_id_ == 0) {
    log_process_rank_ref().store(comm_->rank());
    for (int r = 0; r < comm_->size(); ++r) set_ranks_.push_back(r);
    links_ = std::make_shared<EngineLinks>();
    sets_ = std::make_unique<ProcessSetTable>(*this, comm_handle, overrides);
    // A dead global engine (dead peer, abort) fails every set's collectives.
    on_fatal = [this](const std::string& why) { sets_->abort_sets(as_global_failure(why)); };
    // Rank 0 writes the timeline (as in Horovod): negotiation spans there
    // show when the *last* rank submitted each tensor. Set engines write to
    // the same one (EngineLinks::timeline), on their own rows.
    if (comm_->rank() == 0) timeline().open(cfg_.timeline, comm_->rank());
    timeline().set_mark_cycles(cfg_.timeline_mark_cycles);  // GRADFLOW_TIMELINE_MARK_CYCLES
    GF_LOG(kInfo, comm_->rank(), "started: rank " << comm_->rank() << " of " << comm_->size()
                                                  << ", log level " << cfg_.log_level);
  }
  GF_CHECK(static_cast<int>(set_ranks_.size()) == comm_->size(),
           "gradflow: process set " << set_id_ << " has " << set_ranks_.size()
                                    << " ranks but its communicator " << comm_->size());
  loop_ = std::make_unique<BackgroundLoop>(*comm_, cfg_, queue_, stats_, timeline());
  if (set_id_ != 0) loop_->set_timeline_rows("set" + std::to_string(set_id_) + "/");
  loop_->set_fatal_listener(std::move(on_fatal));
  queue_.set_engine_links(links_);
  loop_->set_engine_links(links_, set_id_ == 0);
  loop_->start();
}

Runtime::~Runtime() { shutdown(); }

std::string Runtime::in_set(const std::string& message, bool set_relative) const {
  if (set_id_ == 0) return message;
  const std::string prefix = "gradflow: ";
  std::string rest = message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size())
                                                                     : message;
  const std::string set = prefix + "process set " + std::to_string(set_id_) + " (ranks " +
                          rank_list_string(set_ranks_);
  // The global engine's text, relayed by any member: global ranks from the
  // marker on (Note [Global failures in a set]); the relay adds nothing.
  const size_t global = rest.find(kGlobalFailure);
  if (global != std::string::npos) return set + "): " + rest.substr(global);
  // The engine's coordinator numbers ranks within its communicator.
  return set + (set_relative ? "; 'rank i' and 'root=i' below count its members" : "") + "): " +
         rest;
}

ProcessSetTable& Runtime::process_sets() {
  GF_CHECK(sets_, "gradflow: process sets are registered on the global engine only");
  return *sets_;
}

int Runtime::set_rank_of(int global_rank) const {
  for (size_t i = 0; i < set_ranks_.size(); ++i)
    if (set_ranks_[i] == global_rank) return static_cast<int>(i);
  return -1;
}

bool Runtime::any_loop(const std::function<bool(BackgroundLoop&)>& f) {
  if (loop_ && f(*loop_)) return true;
  if (sets_)
    for (auto& e : sets_->set_engines())
      if (e->any_loop(f)) return true;
  return false;
}

bool Runtime::failed_fatally() {
  return any_loop([](BackgroundLoop& l) { return l.failed_fatally(); });
}

void Runtime::give_up_blocked_calls() {
  any_loop([](BackgroundLoop& l) {
    l.give_up_if_blocked(false);
    return false;  // every engine's
  });
}

bool Runtime::abandoned() {
  return any_loop([](BackgroundLoop& l) { return l.abandoned(); });
}

void Runtime::check_config_matches_everywhere() {
  gradflow::check_config_matches_everywhere(*comm_, cfg_, config_error_);
}

int64_t Runtime::submit(const SubmitArgs& a) {
  if (set_id_ == 0) return submit_checked(a);
  return in_set_errors([&] { return submit_checked(for_set(a)); });
}

void Runtime::check(const SubmitArgs& a) {
  if (set_id_ == 0) return validate_submit(a);
  in_set_errors([&] {
    validate_submit(for_set(a));
    return int64_t{0};
  });
}

bool Runtime::withdraw(OpKind kind, const std::string& name, int32_t group_size,
                       const std::string& reason) {
  TensorEntry e;
  e.request.rank = comm_->rank();
  e.request.kind = kind;
  e.request.name = name;
  e.request.group_size = group_size;
  e.request.withdrawn = reason.empty() ? "no reason given" : reason;
  try {
    queue_.submit(std::move(e));
    return true;
  } catch (const GradflowError&) {
    return false;  // in flight here, or closed: there is nothing to withdraw
  }
}

SubmitArgs Runtime::for_set(const SubmitArgs& a) const {
  // A set's engine: broadcast's root is a global rank (as in Horovod), the
  // engine's communicator counts set ranks.
  SubmitArgs b = a;
  if (a.kind == OpKind::kBroadcast) {
    b.root = set_rank_of(a.root);
    GF_CHECK_ARG(b.root >= 0, "broadcast '" << a.name << "': root rank " << a.root
                                            << " is not a member of this process set");
  }
  return b;
}

int64_t Runtime::in_set_errors(const std::function<int64_t()>& f) const {
  // Every error of a set's engine names the set.
  try {
    return f();
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(in_set(e.what()));
  } catch (const TransportError&) {
    throw;
  } catch (const GradflowError& e) {
    // The engine's failure (its queue closed with the reason its waits fail
    // with: the set's coordinator's words, which count its members), so
    // worded as wait() words it. Without the note, "shutdown() was called on
    // rank 1" in set [1, 2] read as global rank 1, the rank reading it.
    throw GradflowError(in_set(e.what(), true));
  }
}

int64_t Runtime::submit_checked(const SubmitArgs& a) {
  validate_submit(a);
  TensorEntry e;
  Request& r = e.request;
  r.rank = comm_->rank();
  r.kind = a.kind;
  r.name = a.kind == OpKind::kJoin ? std::string(kJoinTensorName) : a.name;
  r.dtype = a.dtype;
  r.shape = a.shape;
  r.op = a.op;
  r.root = a.root;
  r.wire = a.wire < 0 ? cfg_.wire_dtype : static_cast<WireDtype>(a.wire);
  r.prescale = a.prescale;
  r.postscale = a.postscale;
  r.splits = a.splits;
  r.sparse_ratio = a.sparse_ratio < 0 ? cfg_.sparse_ratio : a.sparse_ratio;
  if (a.op == ReduceOp::kAdasum && a.kind == OpKind::kAllreduce) {
    // Adasum is always dense and native: the GRADFLOW_WIRE_DTYPE /
    // GRADFLOW_SPARSE_RATIO defaults do not apply (explicit ones are refused).
    r.wire = WireDtype::kNative;
    r.sparse_ratio = 1.0;
  }
  if (a.kind == OpKind::kAllreduce && !csc_reduces(a.op) && a.sparse_ratio < 0) {
    // Note [CSC sums only]: GRADFLOW_SPARSE_RATIO is for sums; min, max and
    // product stay dense (an explicit sparse_ratio is refused in validate_submit).
    r.sparse_ratio = 1.0;
  }
  r.in_pool = a.in_pool;
  r.step_tag = a.step_tag;
  r.group_size = a.group_size;
  if (a.kind == OpKind::kAlltoall && r.splits.empty()) {
    // Default: the first dimension split as evenly as possible.
    int64_t rows = r.shape.empty() ? 1 : r.shape[0];
    for (int p = 0; p < comm_->size(); ++p)
      r.splits.push_back(rows / comm_->size() + (p < rows % comm_->size() ? 1 : 0));
  }
  e.sparse_residual = a.sparse_residual;
  e.rollback_residual = a.rollback_residual;
  e.pool_residual = a.pool_residual;
  e.input = reinterpret_cast<const void*>(a.input);
  e.output = reinterpret_cast<void*>(a.output);
  return queue_.submit(std::move(e));
}

// Refuses here, on the rank that made it, whatever could not be computed:
// an agreed response is executed on every rank, and an input the executor
// cannot handle must never reach it (InvalidArgumentError -> ValueError).
void Runtime::validate_submit(const SubmitArgs& a) const {
  const int kind = static_cast<int>(a.kind);
  GF_CHECK_ARG(kind >= static_cast<int>(OpKind::kAllreduce) && kind <= static_cast<int>(OpKind::kJoin),
               "gradflow: unknown collective kind code " << kind);
  const char* what = op_kind_name(a.kind);
  GF_CHECK_ARG(!a.name.empty(), "gradflow: a collective needs a name");
  GF_CHECK_ARG(std::string(dtype_name(a.dtype)) != "unknown",
               "gradflow: " << what << " '" << a.name << "': unknown dtype code "
                            << static_cast<int>(a.dtype));
  for (int64_t d : a.shape)
    GF_CHECK_ARG(d >= 0, "gradflow: " << what << " '" << a.name << "': negative dimension in shape "
                                      << shape_string(a.shape));
  std::string why;
  if (a.kind == OpKind::kAllreduce && a.op == ReduceOp::kAdasum) {
    // Same size on every rank, so a refused size raises on every rank.
    GF_CHECK_ARG(adasum_supported(a.dtype, comm_->size(), &why),
                 "gradflow: allreduce '" << a.name << "': " << why);
    GF_CHECK_ARG(a.wire <= 0, "gradflow: allreduce '" << a.name << "': op=Adasum with a 16-bit "
                              "wire (compression=fp16/bf16) is not supported; Adasum's dot "
                              "products need the values as they are: use Compression.none");
    GF_CHECK_ARG(a.sparse_ratio < 0 || a.sparse_ratio >= 1,
                 "gradflow: allreduce '" << a.name << "': op=Adasum with sparse_ratio "
                                         << a.sparse_ratio << " is not supported (sparse chunks "
                                            "would change every dot product); use 1 or None");
    GF_CHECK_ARG(!a.in_pool, "gradflow: gradient pools do not support op=Adasum");
  } else if (a.kind == OpKind::kAllreduce || a.kind == OpKind::kReducescatter) {
    GF_CHECK_ARG(reduce_supported(a.dtype, a.op, &why), "gradflow: " << what << " '" << a.name << "': " << why);
    GF_CHECK_ARG(a.kind != OpKind::kAllreduce || csc_reduces(a.op) || a.sparse_ratio < 0 ||
                     a.sparse_ratio >= 1,
                 "gradflow: allreduce '" << a.name << "': sparse_ratio " << a.sparse_ratio
                                         << " with op=" << reduce_op_name(a.op)
                                         << " is not supported: CSC keeps the unsent part of a "
                                            "sum for the next call, which min, max and product "
                                            "cannot use; pass sparse_ratio=1 or None");
    // Scaling is defined for every numeric dtype (integers as Horovod: in
    // double, truncated); bool has no product with a factor.
    for (double f : {a.prescale, a.postscale})
      GF_CHECK_ARG(f == 1.0 || a.dtype != DataType::kBool,
                   "gradflow: " << what << " '" << a.name << "': prescale_factor/postscale_factor "
                                << f << " on a bool tensor is not supported");
  }
  if (a.kind == OpKind::kBroadcast)
    GF_CHECK_ARG(a.root >= 0 && a.root < comm_->size(),
                 "gradflow: broadcast '" << a.name << "': root rank " << a.root
                                         << " is out of range [0, " << comm_->size() << ")");
  if (a.kind == OpKind::kReducescatter)
    GF_CHECK_ARG(!a.shape.empty(), "gradflow: reducescatter '" << a.name
                                                               << "' needs at least one dimension");
  if (a.kind == OpKind::kAlltoall && !a.splits.empty()) {
    GF_CHECK_ARG(static_cast<int>(a.splits.size()) == comm_->size(),
                 "gradflow: alltoall '" << a.name << "': splits has " << a.splits.size()
                                        << " entries for " << comm_->size() << " ranks");
    int64_t total = 0;
    for (int64_t s : a.splits) {
      GF_CHECK_ARG(s >= 0, "gradflow: alltoall '" << a.name << "': negative split in "
                                                  << shape_string(a.splits));
      total += s;
    }
    // Horovod refuses this at submit (ValueError); a sum below the first
    // dimension is refused later, on every rank, by the coordinator.
    const int64_t rows = a.shape.empty() ? 1 : a.shape[0];
    GF_CHECK_ARG(total <= rows, "gradflow: alltoall '" << a.name << "': splits "
                                    << shape_string(a.splits) << " sum to " << total
                                    << ", more than the first dimension " << rows);
  }
  if (a.kind == OpKind::kAlltoall && a.splits.empty()) {
    // As Horovod: without splits the first dimension must divide evenly
    // (gradflow once split it unevenly, which Horovod code never expects).
    const int64_t rows = a.shape.empty() ? 1 : a.shape[0];
    GF_CHECK_ARG(rows % comm_->size() == 0,
                 "gradflow: alltoall '" << a.name << "': no splits given and the first dimension "
                                        << rows << " is not a multiple of the " << comm_->size()
                                        << " ranks");
  }
  GF_CHECK_ARG(a.wire >= -1 && a.wire <= 2, "gradflow: unknown wire dtype code " << a.wire);
  GF_CHECK_ARG(a.sparse_ratio < 0 || (a.sparse_ratio > 0 && a.sparse_ratio <= 1),
               "gradflow: sparse_ratio must be in (0, 1], got " << a.sparse_ratio);
}

bool Runtime::poll(int64_t handle) { return queue_.poll(handle); }

std::optional<HandleResult> Runtime::wait(int64_t handle,
                                          const std::function<bool()>& interrupted) {
  // Every kInterruptCheck: a loop thread stuck GRADFLOW_TIMEOUT inside an
  // MPI call without deadline fails this engine (Note [Blocking MPI calls]).
  BackgroundLoop* loop = loop_.get();
  std::optional<HandleResult> r = queue_.wait(handle, [&] {
    if (loop) loop->give_up_if_blocked(true);
    return interrupted && interrupted();
  });
  if (r && !r->error.empty()) r->error = in_set(r->error, true);
  return r;
}

void Runtime::shutdown(const std::string& reason) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (loop_ && !reason.empty()) loop_->set_shutdown_reason(reason);
  // A dead global engine aborts the set engines from its loop thread (the
  // fatal listener), but a thread woken by that failure may get here first:
  // sets stopped without the abort would tell their peers "shutdown() was
  // called" instead of why (a raising or dead rank elsewhere).
  if (sets_ && loop_ && loop_->failed_fatally())
    sets_->abort_sets(as_global_failure(loop_->failure()));
  if (sets_) sets_->shutdown_sets();  // Note [Process sets]: every engine stops
  if (loop_) loop_->shutdown();  // joins: the loop thread was the only MPI user
  // Only the global engine closes the shared timeline, after its set engines
  // stopped (shutdown_sets above); a removed set's engine leaves it open.
  if (set_id_ == 0) timeline().close();
  comm_->release_communicator();
}

bool Runtime::owned_by_this_process() const { return pid_ == ::getpid(); }

void Runtime::abort(const std::string& message) {
  if (loop_) loop_->abort(message);
  if (sets_) sets_->abort_sets(message);
}

}  // namespace gradflow
