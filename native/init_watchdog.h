// init_watchdog.h — ends the process when MPI's own start-up, inside
// gradflow.init(), does not return within GRADFLOW_INIT_TIMEOUT.
//
// Why: MPI_Init waits for every rank of the job (a PMI barrier), and a rank
// that never calls init() (it hangs before it, or exited with code 0)
// leaves the others blocked there for ever, in C code that holds the
// Python GIL, so no Python timer can run. gradflow's own bounded waits
// start only once MPI is up. This watchdog is a plain C++ thread: armed
// just before the first `from mpi4py import MPI`, disarmed right after; if
// the import has not returned by then it writes one line naming the cause
// to stderr and calls _exit(1) (MPI is half started: nothing can be undone
// or finalized). The launcher (gradflowrun, mpiexec) then reports the rank.
// GRADFLOW_INIT_TIMEOUT (300 s) is longer than GRADFLOW_TIMEOUT: MPI_Init
// also absorbs the ranks' start-up skew (imports, containers), which a
// correct job may have.
// Its lock and condition variable are never destroyed: a process that
// calls exit() while the watchdog waits (MPI_Init's own abort path) must
// not block in the condition variable's destructor until the deadline.
#pragma once

namespace gradflow {

// Arms the watchdog for `seconds` (> 0); re-arming replaces the deadline.
void arm_init_watchdog(double seconds);
// Disarms it (no-op when not armed).
void disarm_init_watchdog();

}  // namespace gradflow
