// process_sets.cc — registration, removal and lookup of process sets
// (Note [Process sets] in process_sets.h). Agreement goes through the
// global engine's allgather; communicators come from mpi_comm.cc.
#include "process_sets.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "api.h"

namespace gradflow {

namespace {

// Row layout of the agreement allgather: [op, count, operand..., padding].
constexpr int64_t kOpAdd = 1;
constexpr int64_t kOpRemove = 2;
constexpr int64_t kInvalid = -1;  // count of a rank whose own list was invalid
constexpr int64_t kPad = -2;

std::string row_string(const std::vector<int64_t>& row) {
  std::ostringstream os;
  if (row[0] == kOpRemove) {
    os << "remove_process_set(" << row[2] << ")";
    return os.str();
  }
  if (row[1] == kInvalid) return "add_process_set(<invalid rank list>)";
  os << "add_process_set([";
  for (int64_t i = 0; i < row[1]; ++i) os << (i ? ", " : "") << row[2 + i];
  os << "])";
  return os.str();
}

// Why `ranks` cannot be a process set of `size` ranks, or "".
std::string rank_list_problem(const std::vector<int>& ranks, int size) {
  std::ostringstream os;
  if (ranks.empty()) return "a process set needs at least one rank";
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size) {
      os << "rank " << r << " is out of range [0, " << size << ")";
      return os.str();
    }
    if (!seen.insert(r).second) {
      os << "rank " << r << " is listed twice";
      return os.str();
    }
  }
  return "";
}

}  // namespace

std::string rank_list_string(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

ProcessSetTable::ProcessSetTable(Runtime& global, uintptr_t user_comm,
                                 std::map<std::string, std::string> overrides)
    : global_(global), user_comm_(user_comm), overrides_(std::move(overrides)) {}

std::vector<std::vector<int64_t>> ProcessSetTable::agree(std::vector<int64_t> row) {
  const int n = global_.comm().size();
  row.resize(static_cast<size_t>(n) + 2, kPad);
  SubmitArgs a;
  a.kind = OpKind::kAllgather;
  a.name = "gradflow.process_set_change." + std::to_string(changes_++);
  a.input = reinterpret_cast<uintptr_t>(row.data());
  a.dtype = DataType::kInt64;
  a.shape = {1, n + 2};
  HandleResult r = *global_.wait(global_.submit(a));  // not interruptible: always a result
  if (!r.error.empty()) throw GradflowError(r.error);
  GF_CHECK(r.data && r.data->size() == sizeof(int64_t) * static_cast<size_t>(n) * (n + 2),
           "gradflow: process-set agreement returned " << (r.data ? r.data->size() : 0)
                                                       << " bytes");
  const auto* words = reinterpret_cast<const int64_t*>(r.data->data());
  std::vector<std::vector<int64_t>> rows(n);
  for (int p = 0; p < n; ++p) rows[p].assign(words + p * (n + 2), words + (p + 1) * (n + 2));
  return rows;
}

int ProcessSetTable::add(const std::vector<int>& requested) {
  std::lock_guard<std::mutex> change(change_mu_);
  const int n = global_.comm().size();
  const int me = global_.comm().rank();
  std::vector<int> ranks = requested;
  std::sort(ranks.begin(), ranks.end());  // Horovod sorts a set's ranks too
  const std::string problem = rank_list_problem(ranks, n);
  std::vector<int64_t> row = {kOpAdd,
                              problem.empty() ? static_cast<int64_t>(ranks.size()) : kInvalid};
  if (problem.empty()) row.insert(row.end(), ranks.begin(), ranks.end());
  // Always take part in the agreement, even with a bad list: a rank that
  // raised here alone would leave the others waiting.
  std::vector<std::vector<int64_t>> rows = agree(row);

  // Every rank runs the same checks on the same rows: the same outcome.
  std::ostringstream all;
  bool same = true, any_invalid = false;
  for (int p = 0; p < n; ++p) {
    all << (p ? "; " : "") << "rank " << p << ": " << row_string(rows[p]);
    same = same && rows[p] == rows[0];
    any_invalid = any_invalid || (rows[p][0] == kOpAdd && rows[p][1] == kInvalid);
  }
  GF_CHECK_ARG(!any_invalid || !problem.empty(),
               "gradflow: add_process_set: another rank passed an invalid rank list (" << all.str()
                                                                                      << ")");
  GF_CHECK_ARG(problem.empty(), "gradflow: add_process_set(" << rank_list_string(requested)
                                                             << "): " << problem);
  GF_CHECK_ARG(same, "gradflow: add_process_set must be called by every rank with the same ranks, "
                     "in the same order of process-set changes; got "
                         << all.str());
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool is_global = static_cast<int>(ranks.size()) == n;
    GF_CHECK_ARG(!is_global, "gradflow: add_process_set(" << rank_list_string(ranks)
                                                          << "): these are all ranks, the global "
                                                             "process set (id 0) already has them");
    for (const auto& kv : sets_)
      GF_CHECK_ARG(kv.second.ranks != ranks,
                   "gradflow: add_process_set(" << rank_list_string(ranks)
                                                << "): a process set with these ranks already "
                                                   "exists (id "
                                                << kv.first << ")");
    id = next_id_++;
  }
  Entry entry;
  entry.ranks = ranks;
  if (std::find(ranks.begin(), ranks.end(), me) != ranks.end()) {
    // Every member has passed the agreement above, so the blocking
    // MPI_Comm_create_group finds all of them; the engine's own duplicate
    // and configuration check then run with the usual deadline.
    uintptr_t sub = create_group_communicator(user_comm_, ranks, id);
    try {
      Runtime& global = global_;
      entry.engine = std::make_shared<Runtime>(
          sub, overrides_, id, ranks,
          [&global, id, ranks](const std::string& why) {
            // Its ranks count the set's members; the global text that
            // quotes this counts global ranks (Note [Global failures in a
            // set] in api.cc), so the quote says whose numbering it keeps.
            const std::string prefix = "gradflow: ";
            global.abort("process set " + std::to_string(id) + " (ranks " +
                         rank_list_string(ranks) +
                         "; 'rank i' and 'root=i' below count its members) failed: " +
                         (why.compare(0, prefix.size(), prefix) == 0 ? why.substr(prefix.size())
                                                                      : why));
          },
          global.engine_links());
    } catch (...) {
      free_communicator_handle(sub);
      throw;
    }
    free_communicator_handle(sub);
  }
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = std::move(entry);
  return id;
}

bool ProcessSetTable::remove(int id) {
  std::lock_guard<std::mutex> change(change_mu_);
  std::vector<std::vector<int64_t>> rows = agree({kOpRemove, 1, id});
  std::ostringstream all;
  bool same = true;
  for (size_t p = 0; p < rows.size(); ++p) {
    all << (p ? "; " : "") << "rank " << p << ": " << row_string(rows[p]);
    same = same && rows[p] == rows[0];
  }
  GF_CHECK_ARG(same, "gradflow: remove_process_set must be called by every rank with the same "
                     "process set, in the same order of process-set changes; got "
                         << all.str());
  std::shared_ptr<Runtime> engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sets_.find(id);
    if (it == sets_.end()) return false;  // 0 or unknown: the same answer everywhere
    engine = std::move(it->second.engine);
    sets_.erase(it);
  }
  // An agreed stop among the set's members; its pending collectives fail.
  if (engine)
    engine->shutdown("process set " + std::to_string(id) +
                     " was removed (remove_process_set) before this collective ran");
  // Kept while a handle of it holds a result nobody waited for (its
  // communicator is already released); engines whose handles are all
  // waited or dropped go now.
  std::vector<std::shared_ptr<Runtime>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine && engine->holds_handles()) retired_[id] = engine;
    for (auto r = retired_.begin(); r != retired_.end();) {
      if (r->second->holds_handles()) {
        ++r;
      } else {
        gone.push_back(std::move(r->second));
        r = retired_.erase(r);
      }
    }
  }
  return true;
}

std::shared_ptr<Runtime> ProcessSetTable::engine(int id) {
  if (id == 0) return global_.shared_from_this();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  GF_CHECK_ARG(it != sets_.end(),
               "gradflow: process set " << id << " is not registered (never added, or removed by "
                                           "remove_process_set); add it with add_process_set on "
                                           "every rank first");
  GF_CHECK_ARG(it->second.engine,
               "gradflow: process set " << id << " (ranks " << rank_list_string(it->second.ranks)
                                        << ") does not include rank " << global_.comm().rank()
                                        << "; only its members may run collectives on it");
  return it->second.engine;
}

std::shared_ptr<Runtime> ProcessSetTable::handle_engine(int id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = retired_.find(id);
    if (it != retired_.end() && !sets_.count(id)) return it->second;
  }
  return engine(id);
}

std::shared_ptr<Runtime> ProcessSetTable::pool_engine(int64_t pool_id) {
  const int64_t gen = pool_id >> 32;  // Runtime's pool ids: generation << 32 | index
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : sets_)
    if (kv.second.engine && kv.second.engine->generation() == gen) return kv.second.engine;
  return global_.shared_from_this();
}

std::map<int, std::vector<int>> ProcessSetTable::ranks_by_id() {
  std::map<int, std::vector<int>> out;
  out[0] = global_.set_ranks();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : sets_) out[kv.first] = kv.second.ranks;
  return out;
}

std::vector<std::shared_ptr<Runtime>> ProcessSetTable::set_engines() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Runtime>> out;
  for (auto& kv : sets_)
    if (kv.second.engine) out.push_back(kv.second.engine);
  return out;
}

void ProcessSetTable::abort_sets(const std::string& message) {
  // Outside the lock: an engine's abort only flags its loop, but keep the
  // table free for a loop thread's own fatal listener.
  for (auto& e : set_engines()) e->abort(message);
}

void ProcessSetTable::shutdown_sets() {
  std::map<int, Entry> sets;
  std::map<int, std::shared_ptr<Runtime>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sets.swap(sets_);
    retired.swap(retired_);
  }
  // Joining a loop thread must not hold mu_: its fatal listener may take it.
  for (auto& kv : sets)
    if (kv.second.engine) kv.second.engine->shutdown();
}

}  // namespace gradflow
