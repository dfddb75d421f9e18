// python_runtime.cc — the process's one Runtime as the Python bindings hold
// it (Note [Runtime ownership], python_runtime.h) and the lookups from a
// process-set or pool id to the engine a binding calls. No pybind11 defs.
#include "python_runtime.h"

#include <unistd.h>

namespace gradflow {
namespace binding {

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

std::shared_ptr<Runtime> engine(int ps) {
  std::shared_ptr<Runtime> rt = runtime();
  return ps == 0 ? rt : rt->process_sets().engine(ps);
}

std::shared_ptr<Runtime> handle_engine(int ps) {
  std::shared_ptr<Runtime> rt = runtime();
  return ps == 0 ? rt : rt->process_sets().handle_engine(ps);
}

std::shared_ptr<Runtime> pool_engine(int64_t pool) {
  return runtime()->process_sets().pool_engine(pool);
}

}  // namespace binding
}  // namespace gradflow
