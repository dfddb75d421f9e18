// message.h — what ranks tell the coordinator (Request) and what it tells
// them back (Response), with a compact binary serialization. Plain data: no
// MPI, no threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace gradflow {

// Every rank's join() request carries this name, so they meet in one entry.
constexpr const char* kJoinTensorName = "__gradflow_join__";

// One rank's description of one submitted collective. Everything the other
// ranks must agree on is here; buffers are not.
struct Request {
  int32_t rank = 0;
  OpKind kind = OpKind::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;                        // broadcast
  WireDtype wire = WireDtype::kNative;     // allreduce / reducescatter
  double prescale = 1.0, postscale = 1.0;  // allreduce
  std::vector<int64_t> splits;             // alltoall: rows sent to each rank; join: this
                                           // rank's auto-name counters (not in signature())
  double sparse_ratio = 1.0;               // allreduce over a sparse buffer (1 = dense)
  bool in_pool = false;                    // a gradient-pool bucket: in place, never fused
  // The set of collectives this request is submitted with as one step (for
  // TensorFlow's gradient reduction: "4 of 5 gradients #<hash>"), empty if
  // none. Every rank must submit a name with the same tag; a difference
  // means the ranks run different steps (Note [Step tags] in coordinator.h).
  std::string step_tag;
  // The length of the list a grouped op submitted this `<base>.<i>` with
  // (0: not part of a group); in the signature (Note [Grouped lists]).
  int32_t group_size = 0;
  // Non-empty: this rank failed before it could submit the name (a user
  // Compressor raising, an input only it refuses); the text says why. Not a
  // collective: every rank fails the name with it (Note [Withdrawn names]
  // in coordinator.h). Marked in signature(), so a cached name goes slow.
  std::string withdrawn;

  int64_t num_elements() const;
  // Fields that must be equal on every rank for `kind`, as a string used for
  // the response cache key and for mismatch messages.
  std::string signature() const;
};

// The coordinator's decision about one name, executed in list order on every
// rank (Note [Execution order]).
struct Response {
  OpKind kind = OpKind::kAllreduce;
  std::string name;
  std::string error;               // non-empty: every rank fails this name with it
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;      // rank 0's shape (joined ranks use it)
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  WireDtype wire = WireDtype::kNative;
  double prescale = 1.0, postscale = 1.0;
  double sparse_ratio = 1.0;
  bool in_pool = false;
  std::vector<int64_t> first_dims;  // allgather: rows per rank
  std::vector<int64_t> splits;      // alltoall: size*size matrix, row = sender;
                                    // join: element-wise max of the ranks' name counters
  int32_t cache_bit = -1;           // >= 0 if the response was cached under this bit
};

// Control flags every rank contributes each cycle (OR across ranks).
struct RequestMessage {
  std::vector<Request> requests;
  bool shutdown = false;
  std::string abort_message;  // non-empty: this rank is failing (exception, signal)
  // A process-set engine's rank whose process has a global join() pending
  // (Note [Join and process sets] in coordinator.h).
  bool joined = false;
};

struct ResponseMessage {
  std::vector<Response> responses;
  bool shutdown = false;
  std::vector<int64_t> shutdown_ranks;  // which ranks called shutdown() (named in errors)
  std::string abort_message;  // first rank's abort message, with its rank
};

std::vector<uint8_t> serialize(const RequestMessage& list);
RequestMessage deserialize_requests(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> serialize(const ResponseMessage& list);
ResponseMessage deserialize_responses(const std::vector<uint8_t>& bytes);

}  // namespace gradflow
