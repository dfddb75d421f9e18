// request_validation.cc — rank 0's check of one name's requests from every
// rank (kind, dtype, shape, op, root, step tag, grouped-list length,
// withdrawal) and the response it turns into; see request_validation.h.
#include "request_validation.h"

#include <algorithm>
#include <sstream>

#include "group_lists.h"

namespace gradflow {

// Note [Step tags]: a tag may join several checks with " & " (a traced
// Keras step: its gradient list, and on check rounds its hyperparameters).
static std::vector<std::string> tag_parts(const std::string& tag) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t at; (at = tag.find(" & ", from)) != std::string::npos; from = at + 3)
    parts.push_back(tag.substr(from, at - from));
  parts.push_back(tag.substr(from));
  return parts;
}

// Whether the first check in which two tags differ is the hyperparameter one
// (a part missing on one side counts as differing: a rank whose round was
// not a check round).
static bool hyperparameters_differ(const std::string& tag_a, const std::string& tag_b) {
  const std::vector<std::string> a = tag_parts(tag_a), b = tag_parts(tag_b);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string& pa = i < a.size() ? a[i] : std::string();
    const std::string& pb = i < b.size() ? b[i] : std::string();
    if (pa != pb) return pa.rfind("hyperparameters", 0) == 0 || pb.rfind("hyperparameters", 0) == 0;
  }
  return false;
}

// Note [Step tags]: what two different tags of one name mean, per tag kind.
static std::string step_tag_mismatch(const char* kind, const std::string& name, int rank_a,
                                     const std::string& tag_a, int rank_b,
                                     const std::string& tag_b) {
  const bool hyper = hyperparameters_differ(tag_a, tag_b);
  std::ostringstream why;
  why << (hyper ? "the ranks' optimizer hyperparameters differ: rank "
                : "the ranks reduce different sets of gradients in one step: rank ")
      << rank_a << " submitted " << kind << " '" << name << "' as part of {" << tag_a
      << "} but rank " << rank_b << " as part of {" << tag_b << "}. ";
  if (hyper)
    why << "Ranks that update with different learning rates, momentum or weight decay end with "
           "different weights (the tag's #crc covers every step since the last check, 'now' "
           "the current values; a tag without a hyperparameters part names a rank whose round "
           "was not a check round). Usual "
           "causes: an LR scheduler stepped on a rank-local value (ReduceLROnPlateau on each "
           "rank's own validation loss: average it first, e.g. with gradflow.torch.allreduce or "
           "Keras's MetricAverageCallback placed before the scheduler), "
           "or a scheduler or optimizer state restored on some ranks only (restore it "
           "everywhere, or use broadcast_optimizer_state / broadcast_object; Keras: "
           "BroadcastGlobalVariablesCallback, which broadcasts the learning rate too)";
  else
    why << "A gradient is None on some ranks only: inside a tf.function traced differently "
           "per rank (Python control flow on the rank's data), pass "
           "unconnected_gradients=tf.UnconnectedGradients.ZERO to gradient(), or run eagerly "
           "(Keras: run_eagerly=True), where gradflow fills in zeros";
  return why.str();
}

// "rank 1 (ValueError: boom)" for every rank that withdrew the name
// (Note [Withdrawn names]); empty if none did.
static std::string withdrawn_reasons(const std::vector<Request>& reqs) {
  std::string out;
  for (size_t r = 0; r < reqs.size(); ++r) {
    if (reqs[r].name.empty() || reqs[r].withdrawn.empty()) continue;
    out += (out.empty() ? "rank " : " and rank ") + std::to_string(r) + " (" + reqs[r].withdrawn +
           ")";
  }
  return out;
}

Response validate_requests(const std::string& name, const std::vector<Request>& reqs,
                           int world_size, int last_joined_rank, std::string* abort_job) {
  const Request* first = nullptr;
  int first_rank = -1;
  for (size_t r = 0; r < reqs.size(); ++r)
    if (!reqs[r].name.empty() && !first) first = &reqs[r], first_rank = static_cast<int>(r);
  Response resp;
  resp.name = name;
  resp.kind = first->kind;
  resp.dtype = first->dtype;
  resp.shape = first->shape;
  resp.op = first->op;
  resp.root = first->root;
  resp.wire = first->wire;
  resp.prescale = first->prescale;
  resp.postscale = first->postscale;
  resp.sparse_ratio = first->sparse_ratio;
  resp.in_pool = first->in_pool;
  // Note [Grouped lists]: an empty list on some ranks withdraws `<base>.0`
  // with a marker; the lists' lengths decide before any withdrawal's reason.
  bool empty_list = false;
  for (const Request& q : reqs)
    if (!q.name.empty() && q.group_size == kEmptyGroupList) empty_list = true;
  if (empty_list) {
    if (all_group_lists_empty(reqs)) {
      resp.error = "gradflow: every rank passed an empty list (nobody waits for this)";
      return resp;
    }
    *abort_job = group_lists_mismatch(op_kind_name(first->kind), name, reqs);
    resp.error = "gradflow: " + *abort_job;
    return resp;
  }
  // Note [Withdrawn names]: a rank that failed before it could submit the
  // name decides it, whatever the others gave (step tags and lists too:
  // its request carries neither).
  std::string why = withdrawn_reasons(reqs);
  if (!why.empty()) {
    resp.error = "gradflow: " + std::string(op_kind_name(first->kind)) + " '" + name +
                 "' failed on " + why + " before it was submitted there, so it fails on every "
                 "rank (the ranks' next calls under this name start afresh)";
    return resp;
  }
  const std::string sig = first->signature();
  std::ostringstream err;
  for (size_t r = 0; r < reqs.size(); ++r) {
    if (reqs[r].name.empty()) {
      if (first->kind != OpKind::kAllreduce && first->kind != OpKind::kJoin)
        err << "gradflow: " << op_kind_name(first->kind) << " '" << name << "' cannot run while rank "
            << r << " has called join() (only allreduce can; a torch DistributedOptimizer's "
               "sparse gradients travel by allgather: pass sparse_as_dense=True to use join())";
      continue;
    }
    if (reqs[r].step_tag != first->step_tag) {
      *abort_job = step_tag_mismatch(op_kind_name(first->kind), name, first_rank,
                                     first->step_tag, static_cast<int>(r), reqs[r].step_tag);
      err << "gradflow: " << *abort_job;
      break;
    }
    if (reqs[r].signature() != sig) {
      // Note [Grouped lists]: the longer lists' extra names can never match.
      const std::string lists = group_lists_mismatch(op_kind_name(first->kind), name, reqs);
      if (!lists.empty()) {
        *abort_job = lists;
        err << "gradflow: " << lists;
        break;
      }
      err << "gradflow: mismatched " << op_kind_name(first->kind) << " '" << name << "': rank "
          << first_rank << " submitted {" << sig << "} but rank " << r << " submitted {"
          << reqs[r].signature() << "}";
      break;
    }
  }
  if (resp.kind == OpKind::kBroadcast && (resp.root < 0 || resp.root >= world_size))
    err << "gradflow: broadcast '" << name << "': root rank " << resp.root
        << " is out of range [0, " << world_size << ")";
  if (resp.kind == OpKind::kJoin) {
    // Every rank joined; report the last one to join, as Horovod does.
    resp.root = last_joined_rank;
    // Each join carries the rank's counters of auto-generated names; the
    // element-wise maximum goes back to every rank, so ranks that skipped
    // unnamed collectives while joined (or had one refused) name the next
    // ones as the others do.
    for (const Request& q : reqs) {
      if (q.splits.size() > resp.splits.size()) resp.splits.resize(q.splits.size(), 0);
      for (size_t i = 0; i < q.splits.size(); ++i)
        resp.splits[i] = std::max(resp.splits[i], q.splits[i]);
    }
  }
  if (resp.kind == OpKind::kAllgather || resp.kind == OpKind::kAlltoall) {
    for (const Request& q : reqs) resp.first_dims.push_back(q.shape.empty() ? 1 : q.shape[0]);
  }
  if (resp.kind == OpKind::kAlltoall && err.str().empty()) {
    for (size_t r = 0; r < reqs.size(); ++r) {
      const Request& q = reqs[r];
      int64_t total = 0;
      for (int64_t s : q.splits) total += s;
      if (q.splits.size() != reqs.size() || total != (q.shape.empty() ? 1 : q.shape[0])) {
        err << "gradflow: alltoall '" << name << "': rank " << r << " gave splits "
            << shape_string(q.splits) << " that do not sum to its first dimension "
            << (q.shape.empty() ? 1 : q.shape[0]) << " over " << reqs.size() << " ranks";
        break;
      }
      resp.splits.insert(resp.splits.end(), q.splits.begin(), q.splits.end());
    }
  }
  if (resp.kind == OpKind::kReducescatter && err.str().empty() &&
      (resp.shape.empty() || resp.shape[0] < 0))
    err << "gradflow: reducescatter '" << name << "' needs a tensor with at least one dimension";
  resp.error = err.str();
  return resp;
}

}  // namespace gradflow
