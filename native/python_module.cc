// python_module.cc — the gradflow._native module: its exceptions and the
// pybind11 defs of the runtime's lifecycle (init, shutdown, fork checks),
// the collectives (submit, wait, poll, release, withdraw, abort), the
// timeline, stats and process sets; argument conversion and one def per api
// function, with a docstring. The defs of gradient pools, configuration and
// pure kernels are in python_{pool,config,kernel}_bindings.cc; the process's
// one Runtime is python_runtime.{h,cc}'s. No communication logic here (it
// lives in api.cc and below).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api.h"
#include "init_watchdog.h"
#include "python_runtime.h"

namespace py = pybind11;
using namespace gradflow;
using namespace gradflow::binding;

namespace {

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
          const bool failed = rt->failed_fatally();
          // A loop thread left inside MPI (Note [Blocking MPI calls]) may
          // still reference the runtime: it is kept for good.
          if (rt->abandoned()) new std::shared_ptr<Runtime>(std::move(rt));
          return failed;
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

  m.def("interrupt_waits",
        [](const std::string& why) {
          interrupt_waits(why);
          // Waits inside MPI calls without deadline see no flag: given up
          // here (Note [Blocking MPI calls], mpi_comm.h).
          if (auto rt = current_or_null()) rt->give_up_blocked_calls();
        },
        "Make every pending and later wait of this process fail at once with `why` (a peer "
        "is known dead, e.g. gradflowrun saw it killed); the runtime then fails fatally.");

  m.def("threads_left_inside_mpi", [] { return threads_left_inside_mpi(); },
        "True if a loop thread of this process was given up inside an MPI call (Note "
        "[Blocking MPI calls]): the exit path must then skip MPI_Finalize.");

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

  bind_pools(m);
  bind_config(m);
  bind_kernels(m);
}
