// python_pool_bindings.cc — pybind11 defs of the gradient pools (the torch
// DistributedOptimizer's buckets and their lazy allreduce, grad_pool.h):
// argument conversion and one def per Runtime pool call, each on the engine
// that owns the pool. No communication logic here (api.cc and below).
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "python_runtime.h"

namespace py = pybind11;
using namespace gradflow;
using namespace gradflow::binding;

void gradflow::binding::bind_pools(py::module_& m) {
  m.def("pool_create",
        [](uintptr_t data, int dtype, std::vector<int64_t> ranges, int64_t bucket_bytes, int op,
           int wire, double prescale, double postscale, double sparse_ratio, int process_set,
           uintptr_t output) {
          return engine(process_set)->pool_create(data, static_cast<DataType>(dtype), ranges, bucket_bytes,
                                       static_cast<ReduceOp>(op), wire, prescale, postscale,
                                       sparse_ratio, output);
        },
        py::arg("data"), py::arg("dtype"), py::arg("ranges"), py::arg("bucket_bytes"),
        py::arg("op"), py::arg("wire"), py::arg("prescale"), py::arg("postscale"),
        py::arg("sparse_ratio"), py::arg("process_set") = 0, py::arg("output") = 0,
        "Register a contiguous gradient pool (reduced over process set `process_set`); ranges "
        "are element counts in layout order. `output` != 0: the CSC residual stays in the pool "
        "buffer and results go to `output` (Note [Residual in the pool]).");
  m.def("pool_output_dirty", [](int64_t pool) { pool_engine(pool)->pool_output_dirty(pool); },
        "Something else wrote into the pool's output buffer: its next step zeroes all of it.");
  m.def("pool_mark_ready", [](int64_t pool, int64_t r) { return pool_engine(pool)->pool_mark_ready(pool, r); },
        "Mark a range ready; returns a handle if a bucket was submitted, else -1.");
  m.def("pool_flush", [](int64_t pool) { return pool_engine(pool)->pool_flush(pool); },
        "Submit every bucket not yet submitted this step; returns their handles.");
  m.def("pool_reset", [](int64_t pool) { pool_engine(pool)->pool_reset(pool); });
  m.def("pool_rollback_residuals",
        [](int64_t pool) { pool_engine(pool)->pool_rollback_residuals(pool); },
        "Every CSC bucket residual of a classic pool back to before the last step "
        "(a step the optimizer skipped).");
  m.def("pool_set_scale",
        [](int64_t pool, double prescale, double postscale) {
          pool_engine(pool)->pool_set_scale(pool, prescale, postscale);
        },
        "Pre/postscale factors for the pool's buckets submitted from now on.");
  m.def("pool_set_step_tag",
        [](int64_t pool, const std::string& tag) { pool_engine(pool)->pool_set_step_tag(pool, tag); },
        "Step tag (native Note [Step tags]) of the pool's buckets submitted from now on.");
  m.def("pool_destroy",
        [](int64_t pool) {
          if (auto rt = current_or_null()) rt->process_sets().pool_engine(pool)->pool_destroy(pool);
        },
        "Forget a pool (an id of an earlier runtime is ignored).");
  m.def("pool_bucket_offsets", [](int64_t pool) { return pool_engine(pool)->pool_bucket_offsets(pool); });
  m.def("pool_open_bucket_names",
        [](int64_t pool) { return pool_engine(pool)->pool_open_bucket_names(pool); },
        py::arg("pool"), "Names of the pool's buckets not submitted this step.");
  m.def("pool_rebucket",
        [](int64_t pool, int64_t bucket_bytes) { pool_engine(pool)->pool_rebucket(pool, bucket_bytes); },
        py::arg("pool"), py::arg("bucket_bytes"),
        "Cut the pool's buckets anew (autotune), between steps, same value on every rank.");
}
