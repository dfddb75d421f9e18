// group_lists.cc — see group_lists.h (Note [Grouped lists]).
#include "group_lists.h"

#include <sstream>

namespace gradflow {

std::string group_lists_mismatch(const std::string& kind, const std::string& name,
                                 const std::vector<Request>& reqs) {
  int first = -1, other = -1;
  for (size_t r = 0; r < reqs.size() && other < 0; ++r) {
    if (reqs[r].name.empty()) continue;  // a joined rank
    if (first < 0) first = static_cast<int>(r);
    if (reqs[r].group_size != reqs[first].group_size) other = static_cast<int>(r);
  }
  if (other < 0) return "";
  auto list = [](int32_t n) {
    if (n == kEmptyGroupList) return std::string("an empty list");
    return n > 0 ? "a list of " + std::to_string(n) + " tensors"
                 : std::string("a single tensor (no list)");
  };
  const size_t dot = name.rfind('.');
  std::ostringstream err;
  err << "grouped " << kind << " '" << (dot == std::string::npos ? name : name.substr(0, dot))
      << "': rank " << first << " passed " << list(reqs[first].group_size) << " but rank "
      << other << " passed " << list(reqs[other].group_size)
      << "; every rank must pass a list of the same length (seen at '" << name << "')";
  return err.str();
}

bool all_group_lists_empty(const std::vector<Request>& reqs) {
  bool any = false;
  for (const Request& q : reqs) {
    if (q.name.empty()) continue;  // a joined rank
    if (q.group_size != kEmptyGroupList) return false;
    any = true;
  }
  return any;
}

}  // namespace gradflow
