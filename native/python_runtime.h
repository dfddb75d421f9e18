// python_runtime.h — what the pybind11 binding files (python_*.cc) share:
// the process's one Runtime and the lookups a binding uses to reach an
// engine (defined in python_runtime.cc), and each binding file's bind_*
// function, which python_module.cc's PYBIND11_MODULE calls once. Only the
// binding files include it; the core never sees pybind11.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "api.h"

namespace gradflow {
namespace binding {

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
Process& process();

// The error every call of a fork() child of an initialized process raises.
std::string fork_message();

// The current runtime, or null; never one inherited through fork().
std::shared_ptr<Runtime> current_or_null();

// The current runtime; raises "not initialized" (a ValueError too) or, in a
// fork() child, fork_message().
std::shared_ptr<Runtime> runtime();

// The engine of process set `ps` (0: the global one; Note [Process sets]).
std::shared_ptr<Runtime> engine(int ps);

// The engine that ran handles of set `ps`, also after remove_process_set
// (ProcessSetTable::handle_engine): a completed handle keeps its result.
std::shared_ptr<Runtime> handle_engine(int ps);

// The engine that owns gradient pool `pool` (a set's optimizer has its pool there).
std::shared_ptr<Runtime> pool_engine(int64_t pool);

// The binding files' defs, in the order python_module.cc adds them.
void bind_pools(pybind11::module_& m);    // python_pool_bindings.cc
void bind_config(pybind11::module_& m);   // python_config_bindings.cc
void bind_kernels(pybind11::module_& m);  // python_kernel_bindings.cc

}  // namespace binding
}  // namespace gradflow
