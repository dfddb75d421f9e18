// response_executor.cc — executes agreed responses: fusion, algorithm
// choice, sparse chunks, scaling, and the non-allreduce collectives.
#include "response_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "mpi_allreduce.h"
#include "pool_merge.h"
#include "halving_doubling_allreduce.h"
#include "recursive_doubling_allreduce.h"
#include "reduce_kernels.h"

namespace gradflow {
namespace {

size_t elements_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// The wire dtype only applies to float32 sums; everything else travels native.
WireDtype effective_wire(WireDtype w, DataType dt, ReduceOp op) {
  if (dt != DataType::kFloat32) return WireDtype::kNative;
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage) return WireDtype::kNative;
  return w;
}

}  // namespace

ResponseExecutor::ResponseExecutor(MpiComm& comm, const Config& cfg, Stats& stats)
    : comm_(comm), cfg_(cfg), stats_(stats), adasum_(comm) {}

ResponseExecutor::~ResponseExecutor() = default;

std::vector<size_t> ResponseExecutor::plan(const std::vector<Response>& responses) const {
  // Only successful, dense, non-pool allreduces are fusable; every other
  // response forms a group of one. Groups never reorder responses.
  std::vector<FusionItem> items;
  for (const Response& r : responses) {
    FusionItem it;
    it.dtype = r.dtype;
    it.op = r.op;
    it.wire = r.wire;
    it.prescale = r.prescale;
    it.postscale = r.postscale;
    it.bytes = elements_of(r.shape) * dtype_size(r.dtype);
    it.fusable = r.kind == OpKind::kAllreduce && r.error.empty() && !r.in_pool &&
                 r.sparse_ratio >= 1.0;
    items.push_back(it);
  }
  std::vector<size_t> groups = plan_fusion(items, static_cast<size_t>(cfg_.fusion_threshold_bytes));
  if (cfg_.pool_merge) groups = merge_adjacent_pool_buckets(responses, groups);
  return groups;
}

AllreduceAlgo ResponseExecutor::choose_algo(size_t bytes, DataType dt) const {
  AllreduceAlgo a = cfg_.allreduce_algo;
  if (a == AllreduceAlgo::kAuto) {
    // Documented table (README, "Configuration and tuning"; measured in
    // docs/performance.md): on one node, messages up to 256 KiB go
    // through the shared-memory two-sync allreduce (two syncs, no ring
    // hops); across nodes, messages up to 16 KiB through recursive doubling
    // (log2 N exchanges instead of 2(N-1) hops); larger ones through the
    // pipelined ring.
    if (comm_.all_on_one_node())
      a = bytes <= (256u << 10) ? AllreduceAlgo::kTwoSync : AllreduceAlgo::kRing;
    else
      a = bytes <= (16u << 10) ? AllreduceAlgo::kRecursiveDoubling : AllreduceAlgo::kRing;
  }
  // Every choice is honoured, whatever the dtype and wire ("mpi" runs the
  // 16-bit cases as an MPI exchange, see mpi_allreduce.h): the stats key
  // allreduce.count.<algo>.<wire> names what really ran.
  (void)dt;
  return a;
}

void ResponseExecutor::record(const char* kind, AllreduceAlgo algo, WireDtype wire,
                              const TransferStats& ts) {
  std::string suffix = std::string(".") + allreduce_algo_name(algo) + "." + wire_dtype_name(wire);
  stats_.add(std::string(kind) + ".count", 1);
  stats_.add(std::string(kind) + ".count" + suffix, 1);
  stats_.add("bytes_sent", static_cast<double>(ts.bytes_sent));
  stats_.add("bytes_received", static_cast<double>(ts.bytes_received));
  stats_.add("bytes_sent" + suffix, static_cast<double>(ts.bytes_sent));
  stats_.add("seconds_codec", ts.codec_seconds);
  stats_.add("seconds_transfer", ts.transfer_seconds);
  stats_.add("seconds_transfer" + suffix, ts.transfer_seconds);
  if (ts.wire_overflow) stats_.add("wire_overflow", 1);  // collectives whose 16-bit wire overflowed
}

void ResponseExecutor::allreduce_dense(void* buf, size_t count, DataType dt, ReduceOp op,
                                       WireDtype wire, TransferStats* ts, const void* input) {
  wire = effective_wire(wire, dt, op);
  AllreduceAlgo algo = choose_algo(count * dtype_size(dt), dt);
  if (input && (algo != AllreduceAlgo::kRing || comm_.size() == 1 || count == 0)) {
    // Only the ring reads an input of its own (Note [Out-of-place ring]).
    std::memcpy(buf, input, count * dtype_size(dt));
    stats_.add("copy_in_bytes", static_cast<double>(count * dtype_size(dt)));
    input = nullptr;
  }
  TransferStats local;
  double t0 = now_seconds();
  if (comm_.size() > 1 && count > 0) {
    switch (algo) {
      case AllreduceAlgo::kMpi:
        mpi_allreduce(comm_, buf, count, dt, op, wire, scratch_, &local);
        break;
      case AllreduceAlgo::kRecursiveDoubling:
        recursive_doubling_allreduce(comm_, buf, count, dt, op, wire, scratch_, &local);
        break;
      case AllreduceAlgo::kHalvingDoubling:
        halving_doubling_allreduce(comm_, buf, count, dt, op, wire,
                                   static_cast<size_t>(cfg_.ring_pipeline_bytes), scratch_, &local);
        break;
      case AllreduceAlgo::kTwoSync:
        if (!two_sync_) two_sync_ = std::make_unique<TwoSyncAllreduce>(comm_);
        two_sync_->allreduce(buf, count, dt, op, wire, &local);
        break;
      default: {
        RingOptions opt;
        opt.pipeline_bytes = static_cast<size_t>(cfg_.ring_pipeline_bytes);
        opt.wire = wire;
        opt.input = input;
        ring_allreduce(comm_, buf, count, dt, op, opt, scratch_, &local);
      }
    }
  }
  local.transfer_seconds = now_seconds() - t0;
  record("allreduce", algo, wire, local);
  last_.algo = algo;
  last_.wire = wire;
  ts->bytes_sent += local.bytes_sent;
  ts->bytes_received += local.bytes_received;
  ts->codec_seconds += local.codec_seconds;
  ts->transfer_seconds += local.transfer_seconds;
  ts->wire_overflow = ts->wire_overflow || local.wire_overflow;
}

void ResponseExecutor::run_group(const std::vector<const Response*>& group,
                                 const std::vector<TensorEntry*>& entries,
                                 std::vector<HandleResult>* results) {
  results->assign(group.size(), HandleResult{});
  last_ = LastRun{};
  for (size_t i = 0; i < group.size(); ++i)
    if (!group[i]->error.empty()) (*results)[i].error = group[i]->error;
  if (group.size() == 1 && !group[0]->error.empty()) return;
  // Refuse before any communication what a kernel would refuse half-way
  // (Runtime::submit refuses it first; this guards every other way in). The
  // response is agreed, so every rank throws here and BackgroundLoop fails
  // the group's handles without losing step with the peers.
  for (const Response* r : group) {
    std::string why;
    if (r->kind != OpKind::kAllreduce && r->kind != OpKind::kReducescatter) continue;
    if (r->kind == OpKind::kAllreduce && r->op == ReduceOp::kAdasum) {
      GF_CHECK(adasum_supported(r->dtype, comm_.size(), &why), "gradflow: " << why);
      GF_CHECK(r->wire == WireDtype::kNative && r->sparse_ratio >= 1.0 && !r->in_pool,
               "gradflow: op=Adasum runs dense, unpooled and with the native wire only");
      continue;
    }
    GF_CHECK(reduce_supported(r->dtype, r->op, &why), "gradflow: " << why);
    GF_CHECK(r->dtype != DataType::kBool || (r->prescale == 1.0 && r->postscale == 1.0),
             "gradflow: cannot scale " << dtype_name(r->dtype) << " tensors");
  }
  if (group[0]->kind == OpKind::kAllreduce) {
    if (group[0]->in_pool) {
      // buckets per pool collective = pool.buckets / pool.collectives
      stats_.add("pool.collectives", 1);
      stats_.add("pool.buckets", static_cast<double>(group.size()));
    }
    if (group.size() > 1 && group[0]->in_pool) run_pool_merged(group, entries, results);
    else run_allreduces(group, entries, results);
  } else {
    run_other(*group[0], entries[0], &(*results)[0]);
  }
}

void ResponseExecutor::run_allreduces(const std::vector<const Response*>& group,
                                      const std::vector<TensorEntry*>& entries,
                                      std::vector<HandleResult>* results) {
  const Response& first = *group[0];
  const DataType dt = first.dtype;
  const size_t esize = dtype_size(dt);
  TransferStats ts;
  // Where the reduction happens: in the caller's output buffer when the
  // group is one tensor (zero copies), else in the fusion buffer.
  void* work = nullptr;
  size_t total = 0;
  for (const Response* r : group) total += elements_of(r->shape);
  // What the caller asked to reduce, before CSC or the 16-bit wire shrink it:
  // bytes_sent / allreduce.bytes_input is the effective compression.
  stats_.add("allreduce.bytes_input", static_cast<double>(total * esize));
  const bool single = group.size() == 1;
  if (single && entries[0] && entries[0]->pool_residual) {
    // A sparse pool bucket whose residual is the pool itself (Note
    // [Residual in the pool]): input P, output G, no pass over the buffer.
    allreduce_pool_residual(first, entries[0], &ts);
    for (auto& r : *results) r.wire_overflow = ts.wire_overflow;
    last_.transfer = ts;
    last_.sparse = true;
    return;
  }
  const uint64_t copied_before = fusion_.bytes_copied();
  // One out-of-place tensor reduced densely as it is: allreduce_dense reads
  // the input itself instead of a copy pass here (a 1 MiB numpy allreduce
  // cost ~40 us more than the in-place call with the copy, ~12 us without;
  // docs/performance.md, "Short spins").
  const bool sparse = first.sparse_ratio < 1.0 && dt == DataType::kFloat32;
  const void* dense_input = nullptr;
  if (single && entries[0] && entries[0]->input != entries[0]->output && !sparse &&
      first.prescale == 1.0 && first.op != ReduceOp::kAdasum)
    dense_input = entries[0]->input;
  if (single) {
    TensorEntry* e = entries[0];
    if (e) {
      if (e->input != e->output && !dense_input) {
        std::memcpy(e->output, e->input, total * esize);
        stats_.add("copy_in_bytes", static_cast<double>(total * esize));
      }
      work = e->output;
    } else {
      zeros_.resize(total * esize);
      work = zeros_.data();
    }
  } else {
    work = fusion_.reserve(total * esize);
    size_t off = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      size_t bytes = elements_of(group[i]->shape) * esize;
      if (entries[i]) fusion_.pack(off, entries[i]->input, bytes);
      off += bytes;
    }
  }
  scale_buffer(work, total, dt, first.prescale);
  // A rank that has joined has no entry: it contributes the op's identity
  // (zeros for sum/average, as Horovod), written after the prescale so that
  // product's 1 stays 1 (fused responses share dtype and op).
  for (size_t i = 0, off = 0; i < group.size(); ++i) {
    size_t count = elements_of(group[i]->shape);
    if (!entries[i]) fill_identity(static_cast<uint8_t*>(work) + off * esize, count, dt, first.op);
    off += count;
  }
  double post = first.postscale;
  if (first.op == ReduceOp::kAverage) post /= comm_.size();
  // Sparse even on one rank: training behaves the same at every size.
  // Sparse responses are never fused (plan()), so the group is this one.
  std::unique_ptr<SparseResidual> temp;
  std::string sparse_error;
  SparseResidual* res =
      sparse ? sparse_residual(first, entries[0], total, &temp, &sparse_error) : nullptr;
  if (!sparse_error.empty()) {
    // Same history of this name on every rank, so every rank refuses it.
    for (auto& r : *results) r.error = sparse_error;
    return;
  }
  if (first.op == ReduceOp::kAdasum) {
    // Tensor boundaries go down with the buffer: each fused tensor gets its
    // own dot products (run_group refused sparse/wire/pool Adasum).
    std::vector<size_t> counts;
    for (const Response* r : group) counts.push_back(elements_of(r->shape));
    TransferStats local;
    double t0 = now_seconds();
    adasum_.allreduce(work, counts, dt, &local);
    local.transfer_seconds = now_seconds() - t0;
    stats_.add("allreduce.count", 1);
    stats_.add("allreduce.count.adasum", 1);
    stats_.add("bytes_sent", static_cast<double>(local.bytes_sent));
    stats_.add("bytes_received", static_cast<double>(local.bytes_received));
    stats_.add("seconds_transfer", local.transfer_seconds);
    ts.bytes_sent += local.bytes_sent;
    ts.bytes_received += local.bytes_received;
    ts.transfer_seconds += local.transfer_seconds;
    scale_buffer(work, total, dt, post);
  } else if (sparse && !sparse_warmup(first)) {
    allreduce_sparse(res, static_cast<float*>(work), first.op, first.wire, first.sparse_ratio,
                     post, &ts, auto_policy(first, total));
  } else {
    if (sparse) stats_.add("sparse.dense_warmup_steps", 1);
    allreduce_dense(work, total, dt, first.op, first.wire, &ts, dense_input);
    scale_buffer(work, total, dt, post);
  }
  if (!single) {
    size_t off = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      size_t bytes = elements_of(group[i]->shape) * esize;
      if (entries[i]) fusion_.unpack(off, entries[i]->output, bytes);
      off += bytes;
    }
    stats_.add("fusion.groups", 1);
    stats_.add("fusion.tensors", static_cast<double>(group.size()));
  }
  stats_.add("fusion.bytes_copied", static_cast<double>(fusion_.bytes_copied() - copied_before));
  for (auto& r : *results) r.wire_overflow = ts.wire_overflow;
  last_.transfer = ts;
  last_.sparse = first.sparse_ratio < 1.0 && dt == DataType::kFloat32;
}

void ResponseExecutor::run_other(const Response& r, TensorEntry* e, HandleResult* result) {
  TransferStats ts;
  double t0 = now_seconds();
  GF_CHECK(e != nullptr || r.kind == OpKind::kJoin || r.kind == OpKind::kBarrier,
           "gradflow: internal error: no local entry for " << op_kind_name(r.kind) << " '"
                                                           << r.name << "'");
  const size_t esize = dtype_size(r.dtype);
  switch (r.kind) {
    case OpKind::kBroadcast: {
      size_t bytes = elements_of(r.shape) * esize;
      if (e->input != e->output && comm_.rank() == r.root) std::memcpy(e->output, e->input, bytes);
      broadcast(comm_, e->output, bytes, r.root, &ts);
      break;
    }
    case OpKind::kAllgather: {
      size_t row = r.shape.size() > 1 ? elements_of({r.shape.begin() + 1, r.shape.end()}) : 1;
      int64_t rows = 0;
      for (int64_t d : r.first_dims) rows += d;
      result->data = std::make_shared<std::vector<uint8_t>>(rows * row * esize);
      allgather(comm_, e->input, result->data->data(), r.first_dims, row, r.dtype, &ts);
      result->shape = e->request.shape.empty() ? std::vector<int64_t>{rows} : e->request.shape;
      result->shape[0] = rows;
      break;
    }
    case OpKind::kAlltoall: {
      const int n = comm_.size(), me = comm_.rank();
      size_t row = r.shape.size() > 1 ? elements_of({r.shape.begin() + 1, r.shape.end()}) : 1;
      std::vector<int64_t> recv(n);
      int64_t rows = 0;
      for (int p = 0; p < n; ++p) rows += (recv[p] = r.splits[p * n + me]);
      result->data = std::make_shared<std::vector<uint8_t>>(rows * row * esize);
      // The whole agreed matrix goes down: it picks the protocol (Note
      // [Execution order]: only agreed data may decide what ranks post).
      alltoall(comm_, e->input, result->data->data(), r.splits, row, r.dtype, &ts);
      result->shape = e->request.shape.empty() ? std::vector<int64_t>{rows} : e->request.shape;
      result->shape[0] = rows;
      result->recv_splits = recv;
      break;
    }
    case OpKind::kReducescatter: {
      const int n = comm_.size();
      int64_t dim0 = r.shape[0];
      size_t row = elements_of({r.shape.begin() + 1, r.shape.end()});
      std::vector<int64_t> rows(n);
      for (int p = 0; p < n; ++p) rows[p] = dim0 / n + (p < dim0 % n ? 1 : 0);
      RingOptions opt;
      opt.pipeline_bytes = static_cast<size_t>(cfg_.ring_pipeline_bytes);
      opt.wire = effective_wire(r.wire, r.dtype, r.op);
      std::vector<int64_t> out_shape = r.shape;
      out_shape[0] = rows[comm_.rank()];
      result->data = std::make_shared<std::vector<uint8_t>>(rows[comm_.rank()] * row * esize);
      // prescale multiplies the inputs before the reduction (Horovod's
      // semantics: it also keeps a 16-bit wire from overflowing); the
      // caller's buffer is read-only here, so a private copy is scaled.
      const void* in = e->input;
      std::vector<uint8_t> scaled;
      if (r.prescale != 1.0) {
        const auto* src = static_cast<const uint8_t*>(e->input);
        scaled.assign(src, src + static_cast<size_t>(dim0) * row * esize);
        scale_buffer(scaled.data(), static_cast<size_t>(dim0) * row, r.dtype, r.prescale);
        in = scaled.data();
      }
      reducescatter(comm_, in, result->data->data(), rows, row, r.dtype, r.op, opt, scratch_,
                    &ts);
      // Horovod's order: Average divides the postscale factor by the size
      // (one multiplication afterwards; integers truncate once, see scale_buffer).
      double post = r.postscale;
      if (r.op == ReduceOp::kAverage) post /= n;
      scale_buffer(result->data->data(), rows[comm_.rank()] * row, r.dtype, post);
      result->shape = out_shape;
      break;
    }
    case OpKind::kBarrier:
      break;  // agreement itself is the barrier
    case OpKind::kJoin:
      result->shape = {r.root};  // the last rank to join
      result->recv_splits = r.splits;  // agreed auto-name counters (Coordinator::validate)
      break;
    case OpKind::kAllreduce:
      break;  // handled by run_allreduces
  }
  ts.transfer_seconds = now_seconds() - t0;
  last_.transfer = ts;
  stats_.add(std::string(op_kind_name(r.kind)) + ".count", 1);
  stats_.add("bytes_sent", static_cast<double>(ts.bytes_sent));
  stats_.add("bytes_received", static_cast<double>(ts.bytes_received));
  stats_.add("seconds_transfer", ts.transfer_seconds);
}

}  // namespace gradflow
