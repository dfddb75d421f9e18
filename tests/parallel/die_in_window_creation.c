/* die_in_window_creation.c - a test rank's death inside a two-sync window's
 * creation, deterministically (tests/parallel/_window_fault.py builds it;
 * sigkill_rank_script.py and elastic_torch_script.py load it).
 *
 * Through MPI's profiling interface this library's MPI_Win_allocate_shared
 * and MPI_Win_allocate stand in for MPI's (loaded RTLD_GLOBAL before
 * gradflow, so the extension binds to them). Once the script arms it
 * (gf_window_fault_arm), the next window creation on this rank does not
 * reach MPI: the rank prints "rank R: <how> at <epoch>" and dies, SIGKILL
 * or _exit(3), `delay_ms` after entering, while the other ranks, past
 * create_window's deadline barrier, are inside the call waiting for it: the
 * case of Note [Blocking MPI calls] (native/mpi_comm.h). A death timed from
 * Python (a sleep after the submit) landed there only some of the time
 * (20-60 ms windows that moved with the machine's load), so the tests
 * searched for the delay and could run out of tries. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int armed = 0;   /* 1: SIGKILL, 2: _exit(3) */
static volatile int delay_ms = 0;
static volatile int rank_for_message = -1;

void gf_window_fault_arm(int how, int delay, int rank) {
  delay_ms = delay;
  rank_for_message = rank;
  __atomic_store_n(&armed, how, __ATOMIC_SEQ_CST);
}

static void maybe_die(void) {
  int how = __atomic_load_n(&armed, __ATOMIC_SEQ_CST);
  if (how == 0) return;
  struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);  /* the other ranks enter the call meanwhile */
  struct timeval tv;
  gettimeofday(&tv, NULL);
  printf("rank %d: %s at %.3f (inside window creation)\n", rank_for_message,
         how == 1 ? "SIGKILL" : "exit 3", tv.tv_sec + tv.tv_usec / 1e6);
  fflush(stdout);
  if (how == 1) kill(getpid(), SIGKILL);
  _exit(3);
}

int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm,
                            void *baseptr, MPI_Win *win) {
  maybe_die();
  return PMPI_Win_allocate_shared(size, disp_unit, info, comm, baseptr, win);
}

int MPI_Win_allocate(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                     MPI_Win *win) {
  maybe_die();
  return PMPI_Win_allocate(size, disp_unit, info, comm, baseptr, win);
}
