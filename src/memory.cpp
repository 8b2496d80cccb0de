#include "strata/memory.h"

#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

// The first number in a file ("max" and unreadable files: none).
bool read_number(const std::string& path, int64_t* out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return false;
  try {
    size_t used = 0;
    *out = std::stoll(word, &used);
    return used == word.size();
  } catch (const std::exception&) {
    return false;
  }
}

// This process's cgroup path for the memory controller ("" in v2's single hierarchy).
std::string cgroup_path(bool* v2) {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v2_path;
  while (std::getline(in, line)) {
    // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers == "memory" || controllers.find("memory,") == 0 ||
        controllers.find(",memory") != std::string::npos) {
      *v2 = false;
      return path;
    }
    if (controllers.empty()) v2_path = path;
  }
  *v2 = true;
  return v2_path;
}

// The cgroup's limit less its usage; INT64_MAX when there is no limit.
int64_t cgroup_headroom() {
  bool v2 = true;
  const std::string path = cgroup_path(&v2);
  int64_t limit = 0, usage = 0;
  if (v2) {
    const std::string dir = "/sys/fs/cgroup" + path;
    if (read_number(dir + "/memory.max", &limit) && read_number(dir + "/memory.current", &usage))
      return limit - usage;
  } else {
    for (const std::string& dir : {"/sys/fs/cgroup/memory" + path, std::string("/sys/fs/cgroup/memory")})
      if (read_number(dir + "/memory.limit_in_bytes", &limit) &&
          read_number(dir + "/memory.usage_in_bytes", &usage) && limit < (int64_t(1) << 60))
        return limit - usage;
  }
  return INT64_MAX;
}

}  // namespace

int64_t available_memory_bytes() {
  int64_t avail = INT64_MAX;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  return std::max<int64_t>(0, std::min(avail, cgroup_headroom()));
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

void require_memory(double bytes, const std::string& what) {
  const int64_t avail = available_memory_bytes();
  if (bytes < 0 || bytes > double(avail))
    fail_input("{} needs {}; this node has {} available", what,
               bytes < 0 ? std::string("more than 8 EiB") : format_bytes(bytes), format_bytes(double(avail)));
}

}  // namespace strata
