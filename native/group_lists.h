// group_lists.h — rank 0's check that a grouped op (grouped_allreduce,
// grouped_allgather, grouped_reducescatter, TensorFlow's broadcast_ of a
// variable list) got lists of the same length on every rank.
//
// Note [Grouped lists]: a grouped op submits `<base>.<i>` for i < n, and
// every one of those requests carries n (Request::group_size, part of the
// signature). Before, ranks that passed lists of different lengths reduced
// the common tensors as if nothing were wrong, and the longer lists' extra
// tensors waited for GRADFLOW_TIMEOUT. Those extra names can never complete
// (the shorter ranks will not submit them), and failing them by name is not
// safe either: a rank that already moved on may have resubmitted the same
// user-given names, and a by-name error would fail its new call. So, as for
// differing step tags (Note [Step tags] in coordinator.h), the job aborts at
// once with a message naming both lengths: every rank raises it.
//
// An empty list submits nothing, so on its own it would leave the other
// ranks' members waiting for GRADFLOW_TIMEOUT. So a rank that passes an
// empty list withdraws `<base>.0` with group size kEmptyGroupList (Note
// [Withdrawn names]: the withdrawal has no caller to wait): if another rank
// submitted members, its lists differ (the job aborts, as above); if every
// rank passed an empty list, the name ends with nobody waiting for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "message.h"

namespace gradflow {

// Request::group_size of the withdrawal an empty list sends for `<base>.0`.
constexpr int32_t kEmptyGroupList = -1;

// Whether every rank that submitted `reqs` (indexed by rank; an empty name
// did not submit) passed an empty list.
bool all_group_lists_empty(const std::vector<Request>& reqs);

// The error for `name` (of `kind`) if the ranks' group sizes differ in
// `reqs` (indexed by rank; an empty name did not submit), else "".
std::string group_lists_mismatch(const std::string& kind, const std::string& name,
                                 const std::vector<Request>& reqs);

}  // namespace gradflow
