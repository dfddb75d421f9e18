// timeline.cc — Chrome-trace JSON writer (array format, one event per line).
#include "timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common.h"

namespace gradflow {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// Never follows a symbolic link planted at `path` (O_NOFOLLOW) and writes
// only regular files (a FIFO or device is refused, without blocking on it).
std::FILE* open_for_writing(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  int err = errno;
  GF_CHECK(fd >= 0, "gradflow: cannot open timeline file '"
                        << path << "' (GRADFLOW_TIMELINE or start_timeline): "
                        << (err == ELOOP ? "it is a symbolic link, which gradflow does not follow"
                                         : std::strerror(err)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GradflowError("gradflow: timeline file '" + path +
                        "' (GRADFLOW_TIMELINE or start_timeline) is not a regular file");
  }
  // Truncate only now that it is known to be a regular file; back to blocking writes.
  if (::ftruncate(fd, 0) != 0 || ::fcntl(fd, F_SETFL, 0) != 0) {
    err = errno;
    ::close(fd);
    throw GradflowError("gradflow: cannot truncate timeline file '" + path +
                        "' (GRADFLOW_TIMELINE or start_timeline): " + std::strerror(err));
  }
  FILE* f = ::fdopen(fd, "w");
  if (!f) ::close(fd);
  GF_CHECK(f != nullptr, "gradflow: cannot open timeline file '" << path << "'");
  return f;
}

}  // namespace

void Timeline::open(const std::string& path, int rank) {
  if (path.empty()) return;
  std::FILE* f = open_for_writing(path);  // before closing the current one: a bad path keeps it
  std::lock_guard<std::mutex> lock(mu_);
  close_locked();
  file_ = f;
  rank_ = rank;
  origin_ = Clock::now();
  rows_.clear();  // a new file needs its row names again
  std::fputs("[\n", f);
  first_event_ = true;
  write_event("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
              ", \"args\": {\"name\": \"gradflow rank " + std::to_string(rank_) + "\"}}");
  row_of("steps");
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mu_);
  close_locked();
}

void Timeline::close_locked() {
  std::FILE* f = file_.exchange(nullptr);
  if (!f) return;
  std::fputs("\n]\n", f);
  std::fclose(f);
}

void Timeline::cycle(const std::string& row) {
  if (!mark_cycles_.load() || !enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  char ts[64];
  std::snprintf(ts, sizeof(ts), "%.3f", micros(Clock::now()));
  write_event(std::string("{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"t\", \"ts\": ") +
              ts + ", \"pid\": " + std::to_string(rank_) + ", \"tid\": " +
              std::to_string(row_of(row)) + "}");
}

double Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Timeline::write_event(const std::string& json) {
  std::FILE* f = file_.load();
  if (!first_event_) std::fputs(",\n", f);
  first_event_ = false;
  std::fputs(json.c_str(), f);
}

int Timeline::row_of(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  int row = static_cast<int>(rows_.size());
  rows_[tensor] = row;
  write_event("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
              ", \"tid\": " + std::to_string(row) + ", \"args\": {\"name\": \"" +
              json_escape(tensor) + "\"}}");
  return row;
}

void Timeline::span(const std::string& tensor, const char* name, Clock::time_point start,
                    Clock::time_point end, const std::string& args_json) {
  if (!file_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  char head[160];
  std::snprintf(head, sizeof(head), "{\"name\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, ",
                name, micros(start), micros(end) - micros(start));
  write_event(std::string(head) + "\"pid\": " + std::to_string(rank_) +
              ", \"tid\": " + std::to_string(row_of(tensor)) + ", \"args\": {" + args_json + "}}");
}

void Timeline::mark(const std::string& name, const std::string& row) {
  if (!file_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  char ts[64];
  std::snprintf(ts, sizeof(ts), "%.3f", micros(Clock::now()));
  write_event("{\"name\": \"" + json_escape(name) + "\", \"ph\": \"i\", \"s\": \"t\", \"ts\": " +
              ts + ", \"pid\": " + std::to_string(rank_) + ", \"tid\": " +
              std::to_string(row_of(row)) + "}");
}

}  // namespace gradflow
