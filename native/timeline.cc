// timeline.cc — Chrome-trace JSON writer (array format, one event per line).
#include "timeline.h"

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

void Timeline::open(const std::string& path, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (path.empty() || file_) return;
  file_ = std::fopen(path.c_str(), "w");
  GF_CHECK(file_ != nullptr, "gradflow: cannot open timeline file '" << path
                                                                    << "' (GRADFLOW_TIMELINE)");
  rank_ = rank;
  origin_ = Clock::now();
  std::fputs("[\n", file_);
  first_event_ = true;
  write_event("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(rank_) +
              ", \"args\": {\"name\": \"gradflow rank " + std::to_string(rank_) + "\"}}");
  row_of("steps");
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

double Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Timeline::write_event(const std::string& json) {
  if (!first_event_) std::fputs(",\n", file_);
  first_event_ = false;
  std::fputs(json.c_str(), file_);
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

void Timeline::mark(const std::string& name) {
  if (!file_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  char ts[64];
  std::snprintf(ts, sizeof(ts), "%.3f", micros(Clock::now()));
  write_event("{\"name\": \"" + json_escape(name) + "\", \"ph\": \"i\", \"s\": \"t\", \"ts\": " +
              ts + ", \"pid\": " + std::to_string(rank_) + ", \"tid\": " +
              std::to_string(row_of("steps")) + "}");
}

}  // namespace gradflow
