// python_module.cc — pybind11 bindings only: argument conversion and one
// def per api function, with a docstring. Holds the process's one Runtime.
// No communication logic here (it lives in api.cc and below).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "api.h"
#include "fusion_buffer.h"
#include "init_watchdog.h"
#include "reduce_kernels.h"
#include "sparse_chunks.h"
#include "sparse_pool_residual.h"
#include "wire_codec.h"

namespace py = pybind11;
using namespace gradflow;

namespace {

// Note [Runtime ownership]: the process's one Runtime is shared: every
// binding takes its own reference for the length of the call, so shutdown()
// on one thread never destroys the object under another thread's wait() or
// submit() (those see the stopped queue and raise). The holder is never
// destroyed (a static destructor at exit could otherwise join a thread that
// does not exist, e.g. in a fork() child).
struct Process {
  std::mutex mu;
  // Threads inside wait() (GIL released). At exit the interpreter kills a
  // thread that takes the GIL back during finalization, and in C++ that
  // unwinding ends in std::terminate: gradflow's at-exit handler lets these
  // threads return to Python first (threads_waiting()).
  std::atomic<int> waiting{0};
  std::shared_ptr<Runtime> runtime;
  bool init_failed_fatally = false;  // init() timed out: MPI_Finalize could hang
};
Process& process() {
  static Process* p = new Process;
  return *p;
}

std::string fork_message() {
  return "gradflow: this process (pid " + std::to_string(::getpid()) +
         ") is a fork() of the process that called gradflow.init(); the runtime (its "
         "background thread and MPI connections) does not survive fork(). Use gradflow only in "
         "the process that called init() (start worker processes with the 'spawn' method)";
}

// The current runtime, or null; never one inherited through fork().
std::shared_ptr<Runtime> current_or_null() {
  std::lock_guard<std::mutex> lock(process().mu);
  const auto& rt = process().runtime;
  return rt && rt->owned_by_this_process() ? rt : nullptr;
}

std::shared_ptr<Runtime> runtime() {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(process().mu);
    rt = process().runtime;
  }
  // InvalidArgumentError: a ValueError too, which Horovod raises before init().
  if (!rt)
    throw InvalidArgumentError(
        "gradflow has not been initialized: call gradflow.init() (or hvd.init()) first");
  if (!rt->owned_by_this_process()) throw GradflowError(fork_message());
  return rt;
}

// The engine of process set `ps` (0: the global one; Note [Process sets]).
std::shared_ptr<Runtime> engine(int ps) {
  std::shared_ptr<Runtime> rt = runtime();
  return ps == 0 ? rt : rt->process_sets().engine(ps);
}

// The engine that ran handles of set `ps`, also after remove_process_set
// (ProcessSetTable::handle_engine): a completed handle keeps its result.
std::shared_ptr<Runtime> handle_engine(int ps) {
  std::shared_ptr<Runtime> rt = runtime();
  return ps == 0 ? rt : rt->process_sets().handle_engine(ps);
}

// The engine that owns gradient pool `pool` (a set's optimizer has its pool there).
std::shared_ptr<Runtime> pool_engine(int64_t pool) {
  return runtime()->process_sets().pool_engine(pool);
}

// A binding with submit()'s Python parameters that runs `act(engine, args)`
// on the process set's engine: submit() and check() share one parameter list.
template <typename Act>
auto with_submit_args(Act act) {
  return [act](int kind, const std::string& name, uintptr_t input, uintptr_t output, int dtype,
               std::vector<int64_t> shape, int op, int root, int wire, double prescale,
               double postscale, std::vector<int64_t> splits, double sparse_ratio,
               int process_set, const std::string& step_tag, bool rollback_residual,
               int group_size) {
    SubmitArgs a;
    a.kind = static_cast<OpKind>(kind);
    a.name = name;
    a.input = input;
    a.output = output;
    a.dtype = static_cast<DataType>(dtype);
    a.shape = std::move(shape);
    a.op = static_cast<ReduceOp>(op);
    a.root = root;
    a.wire = wire;
    a.prescale = prescale;
    a.postscale = postscale;
    a.splits = std::move(splits);
    a.sparse_ratio = sparse_ratio;
    a.step_tag = step_tag;
    a.rollback_residual = rollback_residual;
    a.group_size = group_size;
    return act(*engine(process_set), a);
  };
}

// The Python GradflowError type (set when the module is made).
py::handle g_gradflow_error_type;

py::object result_to_python(HandleResult r) {
  if (!r.error.empty() && r.agreed && g_gradflow_error_type) {
    // Raised on every rank alike: `job_wide` tells the excepthook to say so
    // to gradflowrun, which then blames no rank (_runtime._install_hooks).
    py::object e = g_gradflow_error_type(r.error);
    e.attr("job_wide") = true;
    PyErr_SetObject(g_gradflow_error_type.ptr(), e.ptr());
    throw py::error_already_set();
  }
  if (!r.error.empty()) throw GradflowError(r.error);
  py::dict out;
  out["wire_overflow"] = r.wire_overflow;
  out["shape"] = r.shape;
  out["recv_splits"] = r.recv_splits;
  if (r.data) {
    auto* holder = new std::shared_ptr<std::vector<uint8_t>>(r.data);
    py::capsule owner(holder, [](void* p) {
      delete static_cast<std::shared_ptr<std::vector<uint8_t>>*>(p);
    });
    out["data"] = py::array_t<uint8_t>({static_cast<py::ssize_t>(r.data->size())},
                                       {static_cast<py::ssize_t>(1)}, r.data->data(), owner);
  } else {
    out["data"] = py::none();
  }
  return std::move(out);
}

template <typename T>
py::array_t<T> contiguous(py::array_t<T, py::array::c_style | py::array::forcecast> a) {
  return a;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "gradflow native core (framework-agnostic). Use the gradflow package, not this.";
  // Horovod's HorovodInternalError (a RuntimeError) is what a Horovod user
  // catches around failed collectives: every GradflowError is one.
  py::object horovod_internal = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "gradflow.HorovodInternalError",
      "A collective (or the runtime) failed; Horovod's name. Every GradflowError is one.",
      PyExc_RuntimeError, nullptr));
  m.attr("HorovodInternalError") = horovod_internal;
  auto& base = py::register_exception<GradflowError>(m, "GradflowError", horovod_internal);
  g_gradflow_error_type = base;
  // Registered after GradflowError so pybind11 tries it first: bad arguments
  // refused at submit are both a GradflowError and a ValueError.
  py::register_exception<InvalidArgumentError>(
      m, "GradflowValueError", py::make_tuple(base, py::handle(PyExc_ValueError)));

  m.def("init",
        [](uintptr_t comm, std::map<std::string, std::string> overrides) {
          {
            std::lock_guard<std::mutex> lock(process().mu);
            const auto& rt = process().runtime;
            if (rt && !rt->owned_by_this_process()) throw GradflowError(fork_message());
            if (rt) return;
          }
          std::shared_ptr<Runtime> rt;
          try {
            rt = std::make_shared<Runtime>(comm, overrides);
          } catch (const TransportError&) {
            std::lock_guard<std::mutex> lock(process().mu);
            process().init_failed_fatally = true;
            throw;
          }
          std::lock_guard<std::mutex> lock(process().mu);
          process().init_failed_fatally = false;
          if (!process().runtime) process().runtime = std::move(rt);
        },
        py::arg("comm_handle"), py::arg("overrides"),
        "Create the runtime on an MPI communicator handle (0 = MPI_COMM_WORLD).",
        py::call_guard<py::gil_scoped_release>());
  m.def("shutdown", [] {
          std::shared_ptr<Runtime> rt;
          {
            std::lock_guard<std::mutex> lock(process().mu);
            rt.swap(process().runtime);
          }
          if (!rt) return false;
          if (!rt->owned_by_this_process()) {  // fork() child: the parent's; leave it alone
            new std::shared_ptr<Runtime>(std::move(rt));
            return false;
          }
          rt->shutdown();  // waiters holding a reference wake with an error
          return rt->failed_fatally();
        },
        "Stop the background loop and release the runtime (destroyed once no call uses it). "
        "True if it had failed fatally by then (its last cycle may be where a dead peer shows): "
        "MPI_Finalize may hang.",
        py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", [] { return static_cast<bool>(current_or_null()); },
        "True if init() was called in this process (not inherited through fork()) and shutdown() was not.");
  m.def("rank", [] { return runtime()->comm().rank(); });
  m.def("size", [] { return runtime()->comm().size(); });
  m.def("local_rank", [] { return runtime()->comm().local_rank(); });
  m.def("local_size", [] { return runtime()->comm().local_size(); });
  m.def("cross_rank", [] { return runtime()->comm().cross_rank(); });
  m.def("cross_size", [] { return runtime()->comm().cross_size(); });

  m.def("submit", with_submit_args([](Runtime& rt, const SubmitArgs& a) { return rt.submit(a); }),
        py::arg("kind"), py::arg("name"), py::arg("input"), py::arg("output"), py::arg("dtype"),
        py::arg("shape"), py::arg("op"), py::arg("root"), py::arg("wire"), py::arg("prescale"),
        py::arg("postscale"), py::arg("splits"), py::arg("sparse_ratio"),
        py::arg("process_set") = 0, py::arg("step_tag") = "", py::arg("rollback_residual") = false,
        py::arg("group_size") = 0,
        "Queue one collective on caller-owned buffers (raw addresses) in process set "
        "`process_set` (0: all ranks); returns a handle. `step_tag`: the step this allreduce "
        "belongs to, equal on every rank (a difference aborts the job: Note [Step tags]). "
        "`rollback_residual`: a named sparse allreduce first undoes its residual's last step "
        "(the optimizer skipped it). `group_size`: the length of the list a grouped op "
        "submits this member of (Note [Grouped lists]).");
  m.def("check", with_submit_args([](Runtime& rt, const SubmitArgs& a) { rt.check(a); }),
        "submit()'s checks (same arguments) without submitting: raises what submit() would "
        "raise for a bad argument.");
  m.def("withdraw",
        [](int kind, const std::string& name, int process_set, const std::string& reason,
           int group_size) {
          return engine(process_set)->withdraw(static_cast<OpKind>(kind), name, group_size, reason);
        },
        py::arg("kind"), py::arg("name"), py::arg("process_set"), py::arg("reason"),
        py::arg("group_size") = 0,
        "This rank failed before it submitted collective `name` of `process_set`: every rank "
        "fails it with `reason` (Note [Withdrawn names]). False if nothing was sent (the name "
        "is in flight here, or the runtime is closed).");
  m.def("poll", [](int64_t h, int ps) { return handle_engine(ps)->poll(h); }, py::arg("handle"),
        py::arg("process_set") = 0, "True once the handle (of that process set) is done.");
  m.def("wait",
        [](int64_t h, int ps, bool interruptible) {
          std::shared_ptr<Runtime> rt = handle_engine(ps);
          std::optional<HandleResult> r;
          struct Count {  // decremented only once the GIL is held again
            Count() { ++process().waiting; }
            ~Count() { --process().waiting; }
          } count;
          // Ctrl-C (the main thread only: Python runs signal handlers there)
          // ends the wait; the handle stays in flight (tensor_queue.h).
          std::function<bool()> interrupted;
          if (interruptible)
            interrupted = [] {
              py::gil_scoped_acquire gil;
              return PyErr_CheckSignals() != 0;  // sets KeyboardInterrupt (or the handler's error)
            };
          {
            py::gil_scoped_release release;
            r = rt->wait(h, interrupted);
          }
          if (!r) throw py::error_already_set();
          return result_to_python(std::move(*r));
        },
        py::arg("handle"), py::arg("process_set") = 0, py::arg("interruptible") = false,
        "Block until the handle is done; raise GradflowError if it failed; return a dict "
        "(data, shape, recv_splits, wire_overflow). `interruptible` (the main thread): a "
        "signal handler's exception (KeyboardInterrupt) ends the wait within 0.1 s and the "
        "handle stays in flight.");
  m.def("arm_init_watchdog",
        [] {
          double seconds = Config{}.init_timeout_seconds;
          try {
            seconds = load_config({}).init_timeout_seconds;
          } catch (const std::exception&) {
            // A bad GRADFLOW_* value is init()'s to report, once MPI is up.
          }
          arm_init_watchdog(seconds);
        },
        "Before MPI's start-up in init(): exit the process with a message if it has not "
        "returned within GRADFLOW_INIT_TIMEOUT (init_watchdog.h).");
  m.def("disarm_init_watchdog", [] { disarm_init_watchdog(); },
        "MPI's start-up returned: the watchdog stands down.");
  m.def("threads_waiting", [] { return process().waiting.load(); },
        "Number of threads inside wait() (Note [Runtime ownership]).");
  m.def("release",
        [](int64_t h, int ps) {
          std::shared_ptr<Runtime> rt = current_or_null();
          if (!rt) return true;
          if (ps == 0) return rt->release(h);
          try {
            return rt->process_sets().engine(ps)->release(h);
          } catch (const InvalidArgumentError&) {
            return true;  // the set was removed: its engine stopped, every handle completed
          }
        },
        py::arg("handle"), py::arg("process_set") = 0,
        "The caller dropped handle `h` (Note [Handle lifetime]): forget its result. True if the "
        "core no longer touches its buffers; False if in flight (take_reaped() reports it later).");
  m.def("take_reaped",
        [] {
          std::shared_ptr<Runtime> rt = current_or_null();
          if (!rt) return std::vector<int64_t>{};
          std::vector<int64_t> out = rt->take_reaped();
          for (auto& e : rt->process_sets().set_engines()) {
            std::vector<int64_t> more = e->take_reaped();
            out.insert(out.end(), more.begin(), more.end());
          }
          return out;
        },
        "Released handles that completed since the last call (their buffers are free to go).");
  m.def("abort",
        [](const std::string& msg) {
          if (auto rt = current_or_null()) rt->abort(msg);
        },
        "Tell every rank that this rank is failing (their collectives raise `msg`).");

  m.def("interrupt_waits", [](const std::string& why) { interrupt_waits(why); },
        "Make every pending and later wait of this process fail at once with `why` (a peer "
        "is known dead, e.g. gradflowrun saw it killed); the runtime then fails fatally.");

  m.def("clear_interrupt",
        [] {
          if (current_or_null())
            throw GradflowError("gradflow: clear_interrupt() needs shutdown() first");
          clear_interrupt();
        },
        "Forget an interrupt_waits() for the next init() (elastic re-formation); only while "
        "gradflow is shut down.");

  m.def("failed_fatally",
        [] {
          std::shared_ptr<Runtime> rt = current_or_null();
          std::lock_guard<std::mutex> lock(process().mu);
          return process().init_failed_fatally || (rt && rt->failed_fatally());
        },
        "True if communication failed (dead/stalled rank, abort, init() timed out): "
        "MPI_Finalize may hang.");
  m.def("forked_child",
        [] {
          std::lock_guard<std::mutex> lock(process().mu);
          const auto& rt = process().runtime;
          return rt && !rt->owned_by_this_process();
        },
        "True in a fork() child of an initialized process (it must not use gradflow).");
  m.def("is_homogeneous", [] { return runtime()->comm().homogeneous(); },
        "True if every node runs the same number of ranks (agreed at init).");
  m.def("timeline_start",
        [](const std::string& path, bool mark_cycles) {
          auto rt = runtime();
          GF_CHECK_ARG(!path.empty(), "gradflow: start_timeline: file_path must not be empty");
          // Rank 0 writes, as with GRADFLOW_TIMELINE; every rank calls it.
          if (rt->comm().rank() == 0) rt->timeline().open(path, 0);
          rt->timeline().set_mark_cycles(mark_cycles);
        },
        py::arg("path"), py::arg("mark_cycles"),
        "Start writing the timeline to `path` (rank 0; replaces a file being written).");
  m.def("timeline_stop",
        [] {
          auto rt = runtime();
          rt->timeline().close();
          rt->timeline().set_mark_cycles(false);
        },
        "Stop the timeline and close its file (no-op if none is being written).");
  m.def("timeline_mark", [](const std::string& name) { runtime()->timeline().mark(name); },
        "Add an instant event (e.g. a step boundary) to the timeline, if one is being written.");
  m.def("stats", [](int ps) { return engine(ps)->stats().snapshot(); },
        py::arg("process_set") = 0, "Counters of one process set's engine since the last reset.");
  m.def("reset_stats", [](int ps) { engine(ps)->stats().reset(); }, py::arg("process_set") = 0);

  m.def("add_process_set",
        [](std::vector<int> ranks) { return runtime()->process_sets().add(ranks); },
        py::arg("ranks"),
        "Collective over all ranks: register a process set of these global ranks and return its "
        "id (ValueError on every rank if the ranks disagree or the list is bad).",
        py::call_guard<py::gil_scoped_release>());
  m.def("remove_process_set", [](int id) { return runtime()->process_sets().remove(id); },
        py::arg("process_set"),
        "Collective over all ranks: remove a process set (its pending collectives fail). False "
        "if it is not registered or is the global set.",
        py::call_guard<py::gil_scoped_release>());
  m.def("process_sets", [] { return runtime()->process_sets().ranks_by_id(); },
        "id -> global ranks of every registered process set, the global set (0) included.");

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

  // ---- pure kernels, exposed for unit tests ----
  m.def("encode_f32", [](int wire, py::array_t<float, py::array::c_style | py::array::forcecast> a) {
          py::array_t<uint16_t> out(a.size());
          bool overflow = encode_f32(static_cast<WireDtype>(wire), a.data(), out.mutable_data(),
                                     a.size());
          return py::make_tuple(out, overflow);
        });
  m.def("decode_f32", [](int wire, py::array_t<uint16_t, py::array::c_style> a) {
          py::array_t<float> out(a.size());
          decode_f32(static_cast<WireDtype>(wire), a.data(), out.mutable_data(), a.size());
          return out;
        });
  m.def("decode_accumulate_f32",
        [](int wire, py::array_t<uint16_t, py::array::c_style> src, py::array_t<float> dst) {
          GF_CHECK(src.size() == dst.size(), "size mismatch");
          decode_accumulate_f32(static_cast<WireDtype>(wire), src.data(), dst.mutable_data(),
                                src.size());
        });
  m.def("set_codec_simd_enabled", &set_codec_simd_enabled);
  m.def("codec_simd_available", &codec_simd_available);
  m.def("codec_impl_name", &codec_impl_name);
  m.def("select_top_chunks", &select_top_chunks);
  m.def("sparse_residual_elements",
        [] { return SparseResidual::live_elements() + PoolResidual::live_elements(); },
        "Elements held by live CSC residuals in this process (for tests).");
  m.def("chunk_importance", [](py::array_t<float, py::array::c_style | py::array::forcecast> a,
                               size_t chunk) {
          std::vector<float> imp;
          chunk_importance(a.data(), a.size(), chunk, &imp);
          return imp;
        });
  m.def("sampled_chunk_importance",
        [](py::array_t<float, py::array::c_style | py::array::forcecast> a, size_t chunk,
           uint64_t phase) {
          std::vector<float> imp;
          sampled_chunk_importance(a.data(), a.size(), chunk, &imp, phase);
          return imp;
        },
        py::arg("values"), py::arg("chunk"), py::arg("phase") = 0);
  m.def("plan_fusion", [](std::vector<std::tuple<int, int, int, double, double, size_t, bool>> items,
                          size_t threshold) {
          std::vector<FusionItem> v;
          for (auto& t : items)
            v.push_back(FusionItem{static_cast<DataType>(std::get<0>(t)),
                                   static_cast<ReduceOp>(std::get<1>(t)),
                                   static_cast<WireDtype>(std::get<2>(t)), std::get<3>(t),
                                   std::get<4>(t), std::get<5>(t), std::get<6>(t)});
          return plan_fusion(v, threshold);
        },
        "Fusion planning (pure): items are (dtype, op, wire, prescale, postscale, bytes, fusable).");
}
