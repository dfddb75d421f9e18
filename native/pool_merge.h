// pool_merge.h — lazy allreduce across bucket boundaries: which agreed pool
// buckets go out as ONE collective. Adjacent buckets of one pool (bucket b
// and b+1) are adjacent in the pool's memory, so a run of them is one
// contiguous range: reducing it in one collective costs no copy and saves
// the per-collective latency (ring steps, handshakes) of all but one.
// Pure functions of the agreed response list (Note [Execution order]), so
// every rank plans the same merges; no buffers, no MPI.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "message.h"

namespace gradflow {

// Parses a GradPool::bucket_name() ("gradflow.pool<P>.bucket<B>", or
// "gradflow.pool<P>.cut<K>.bucket<B>" after an autotune re-cut; K = 0
// without the ".cut" part). False for any other name.
bool parse_pool_bucket_name(const std::string& name, long* pool, long* cut, long* bucket);

// Takes the executor's groups (sizes of consecutive runs of `responses`)
// and joins consecutive single-response groups that are buckets b, b+1, ...
// of one pool, dense (sparse_ratio 1), error-free and with equal dtype, op,
// wire and scales. CSC buckets (sparse_ratio < 1) stay alone: their chunk
// grid, top-k and residual are per bucket (docs/architecture.md, "Gradient
// pool (lazy allreduce)"). Order is never changed.
std::vector<size_t> merge_adjacent_pool_buckets(const std::vector<Response>& responses,
                                                const std::vector<size_t>& groups);

}  // namespace gradflow
