// python_config_bindings.cc — pybind11 defs that describe the settings and
// the build: every GRADFLOW_* key, validation of a configuration, the
// running runtime's configuration, and what this build supports.
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "python_runtime.h"
#include "wire_codec.h"

namespace py = pybind11;
using namespace gradflow;
using namespace gradflow::binding;

void gradflow::binding::bind_config(py::module_& m) {
  m.def("config_keys", [] {
          py::list out;
          for (const ConfigKey& k : config_keys()) {
            py::dict d;
            d["env"] = k.env;
            d["flag"] = k.flag;
            d["type"] = k.type;
            d["default"] = k.default_value;
            d["help"] = k.help;
            d["scale"] = k.flag_to_env_scale;
            d["choices"] = k.choices;
            out.append(d);
          }
          return out;
        },
        "Every GRADFLOW_* setting: env name, launcher flag, type, default, help, scale, choices.");
  m.def("validate_config", [](std::map<std::string, std::string> overrides) {
          Config c = load_config(overrides);
          (void)c;
        },
        "Raise GradflowError if the environment plus `overrides` is not a valid configuration.");
  m.def("config", [] {
          const Config& c = runtime()->config();
          py::dict d;
          d["fusion_threshold_bytes"] = c.fusion_threshold_bytes;
          d["pool_bucket_bytes"] = c.pool_bucket_bytes;
          d["pool_merge"] = c.pool_merge;
          d["cycle_time_ms"] = c.cycle_time_ms;
          d["idle_cycle_max_ms"] = c.idle_cycle_max_ms;
          d["cache_capacity"] = c.cache_capacity;
          d["timeout_seconds"] = c.timeout_seconds;
          d["wire_dtype"] = wire_dtype_name(c.wire_dtype);
          d["allreduce_algo"] = allreduce_algo_name(c.allreduce_algo);
          d["sparse_ratio"] = c.sparse_ratio;
          d["sparse_chunk"] = c.sparse_chunk;
          d["sparse_warmup_steps"] = c.sparse_warmup_steps;
          d["sparse_momentum"] = c.sparse_momentum;
          d["sparse_policy"] = c.sparse_policy_auto ? "auto" : "always";
          d["timeline"] = c.timeline;
          d["ring_pipeline_bytes"] = c.ring_pipeline_bytes;
          d["autotune"] = c.autotune;
          d["autotune_log"] = c.autotune_log;
          d["autotune_warmup_samples"] = c.autotune_warmup_samples;
          d["autotune_steps_per_sample"] = c.autotune_steps_per_sample;
          return d;
        },
        "The configuration the runtime was started with.");
  m.def("features", [] {
          py::dict d;
          d["allreduce_algos"] = std::vector<std::string>{"ring", "two-sync", "mpi", "recursive-doubling", "halving-doubling", "auto"};
          d["wire_dtypes"] = std::vector<std::string>{"fp32", "fp16", "bf16"};
          d["codec"] = codec_impl_name();
          d["mpi"] = MpiComm::library_version();
          d["mpi_built_with"] = MpiComm::built_with();
          d["gpu"] = false;
          return d;
        },
        "What this build supports.");
}
