// request_validation.h — rank 0's check that every rank's request for one
// name agrees, and the response it becomes (the coordinator's slow path,
// coordinator.h, calls it once a name is complete on every rank).
//
// What is checked, in order: a withdrawal (Note [Withdrawn names] in
// coordinator.h: a rank that failed before it could submit decides the
// name, whatever the others gave); a rank that joined (only allreduce runs
// past a joined rank); step tags (Note [Step tags]: a difference aborts the
// job); the signature (kind, dtype, shape, op, root, wire, scales, group
// size: a grouped list of another length aborts the job, Note [Grouped
// lists]); a broadcast root in range; alltoall splits that sum to each
// rank's first dimension; a reducescatter input with a dimension.
#pragma once

#include <string>
#include <vector>

#include "message.h"

namespace gradflow {

// The response for `name` given `reqs` (indexed by rank; an empty name did
// not submit: that rank joined). On a mismatch `error` is set; `*abort_job`
// is set too when nothing of the ranks' step can complete (their step tags
// differ, or a grouped op's lists differ in length). `last_joined_rank`
// is what a completed join() returns (the last rank to join, as Horovod).
Response validate_requests(const std::string& name, const std::vector<Request>& reqs,
                           int world_size, int last_joined_rank, std::string* abort_job);

}  // namespace gradflow
