// process_sets.h — the registry of Horovod-style process sets: which sets
// exist (id -> global ranks, the same table on every rank), and this rank's
// engine for each set it belongs to. Registration and removal are agreed
// over the global set; the engines themselves are ordinary Runtimes.
//
// Note [Process sets]
// A process set is a subset of the global ranks that runs collectives
// together. Each set this rank belongs to gets its own engine: a Runtime on
// a communicator of just those ranks (MPI_Comm_create_group on the user's
// communicator, then duplicated like any init()), with its own tensor
// queue, coordinator, response cache and background thread. So:
//  * collectives on disjoint (or overlapping) sets never wait on each other:
//    each engine negotiates and executes on its own communicator and thread
//    (MPI is initialized at MPI_THREAD_MULTIPLE; engines share no MPI state);
//  * everything the core does on the global set works in a set unchanged
//    (fusion, pools, CSC, wire codec, every algorithm; join() is global
//    only), with ranks and sizes those of the set: Average divides by the
//    set's size, allgather concatenates in set order, alltoall takes one
//    split per set member.
//    Only broadcast's root is a *global* rank (as in Horovod), translated here;
//  * the set id is the same on every rank because registration is agreed:
//    add/remove are collective over the global set; every rank allgathers
//    (through the global engine, so a dead or stuck rank is a bounded
//    error) what it was asked to do, and all check the same rows, so a
//    mismatch raises the same ValueError on every rank instead of a hang.
//    Ids count up from 1 and are never reused: a stale id is "unknown",
//    never another set;
//  * failures cross engines: an engine that dies of a communication failure
//    or an abort aborts every other engine of the process (its listener), and
//    an abort (uncaught exception) goes to all of them, so a dead or failing
//    rank fails pending collectives in every set, on every rank, within the
//    timeout. shutdown() stops every set engine, then the global one.
// Errors from a set's engine name the set (Runtime::in_set()).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gradflow {

class Runtime;

class ProcessSetTable {
 public:
  // `global` owns this table; `user_comm` is the communicator handle it was
  // initialized with (sub-communicators are carved from it, never from the
  // global engine's private duplicate, which its loop thread uses).
  ProcessSetTable(Runtime& global, uintptr_t user_comm,
                  std::map<std::string, std::string> overrides);

  // Collective over the global set. Returns the new set's id; throws
  // InvalidArgumentError (the same on every rank) for a bad or mismatched
  // rank list or a duplicate of an existing set.
  int add(const std::vector<int>& ranks);
  // Collective over the global set. False if `id` is 0 or not registered
  // (on every rank); a mismatch between ranks raises on every rank. The
  // set's pending collectives fail, saying the set was removed; its stopped
  // engine stays reachable through handle_engine() while a handle of it
  // holds a result nobody waited for.
  bool remove(int id);

  // The engine of set `id` (0: the global one). InvalidArgumentError naming
  // the set if it is unknown or this rank is not a member.
  std::shared_ptr<Runtime> engine(int id);
  // engine(id), or the stopped engine of a set this rank was a member of and
  // that was removed: its handles still wait and poll (a completed one keeps
  // its result; pending ones failed when the set was removed).
  std::shared_ptr<Runtime> handle_engine(int id);
  // The engine that created gradient pool `pool_id` (by its generation);
  // the global engine if none does (its lookup then raises).
  std::shared_ptr<Runtime> pool_engine(int64_t pool_id);
  // id -> global ranks of every registered set, the global set (0) included.
  std::map<int, std::vector<int>> ranks_by_id();

  // Every set engine of this process (not the global one).
  std::vector<std::shared_ptr<Runtime>> set_engines();
  // Aborts every set engine (the global engine's abort and fatal listener).
  void abort_sets(const std::string& message);
  // Stops every set engine (global shutdown); the table is then empty.
  void shutdown_sets();

 private:
  struct Entry {
    std::vector<int> ranks;
    std::shared_ptr<Runtime> engine;  // null where this rank is not a member
  };
  // Allgathers `row` (op code + operands) over the global set; returns every
  // rank's row. Throws the global engine's error (dead rank, timeout, ...).
  std::vector<std::vector<int64_t>> agree(std::vector<int64_t> row);

  Runtime& global_;
  uintptr_t user_comm_;
  std::map<std::string, std::string> overrides_;
  std::mutex change_mu_;  // one add/remove at a time in this process
  int64_t changes_ = 0;   // names the agreement collectives (same on every rank)
  int next_id_ = 1;
  std::mutex mu_;  // guards sets_
  std::map<int, Entry> sets_;
  // Removed sets' stopped engines while they hold unwaited handles (mu_).
  std::map<int, std::shared_ptr<Runtime>> retired_;
};

// "[0, 2, 3]"
std::string rank_list_string(const std::vector<int>& ranks);

}  // namespace gradflow
