#include "base/memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <tuple>
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

// The cgroup's limit and usage; false when there is no limit.
bool cgroup_limit(int64_t* limit, int64_t* usage) {
  bool v2 = true;
  const std::string path = cgroup_path(&v2);
  if (v2) {
    const std::string dir = "/sys/fs/cgroup" + path;
    return read_number(dir + "/memory.max", limit) && read_number(dir + "/memory.current", usage);
  }
  for (const std::string& dir : {"/sys/fs/cgroup/memory" + path, std::string("/sys/fs/cgroup/memory")})
    if (read_number(dir + "/memory.limit_in_bytes", limit) &&
        read_number(dir + "/memory.usage_in_bytes", usage) && *limit < (int64_t(1) << 60))
      return true;
  return false;
}

// A field of /proc/self/status in bytes ("VmSize:  123 kB"); 0 when missing.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string k, unit;
  int64_t kb = 0;
  while (in >> k) {
    if (k == key && in >> kb >> unit) return kb * 1024;
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

}  // namespace

MemoryBound memory_bound() {
  MemoryBound b{INT64_MAX, "this node has no memory limit"};
  auto consider = [&](int64_t left, std::string source) {
    left = std::max<int64_t>(0, left);
    if (left < b.bytes) b = {left, std::move(source)};
  };
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    int64_t kb = 0;
    while (in >> key >> kb >> unit)
      if (key == "MemAvailable:") consider(kb * 1024, "");
    if (b.bytes != INT64_MAX) b.source = fmt::format("this node has {} available", format_bytes(double(b.bytes)));
  }
  if (int64_t limit = 0, usage = 0; cgroup_limit(&limit, &usage))
    consider(limit - usage, fmt::format("the job's memory limit (its cgroup's, {}; {} in use) leaves {}",
                                        format_bytes(double(limit)),
                                        format_bytes(double(usage)),
                                        format_bytes(double(std::max<int64_t>(0, limit - usage)))));
  for (const auto& [resource, name, field, what] :
       {std::tuple{RLIMIT_AS, "ulimit -v (RLIMIT_AS", "VmSize:", "address space"},
        std::tuple{RLIMIT_DATA, "ulimit -d (RLIMIT_DATA", "VmData:", "data segment"}}) {
    rlimit rl{};
    if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    const int64_t limit = int64_t(std::min<rlim_t>(rl.rlim_cur, INT64_MAX)), used = status_bytes(field);
    consider(limit - used, fmt::format("this process's {} {}, {} of {} in use) leaves {}", name,
                                       format_bytes(double(limit)), format_bytes(double(used)), what,
                                       format_bytes(double(std::max<int64_t>(0, limit - used)))));
  }
  return b;
}

int64_t available_memory_bytes() { return memory_bound().bytes; }

MemoryBound node_memory_limit() {
  MemoryBound b{INT64_MAX, "this node has no memory limit"};
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") b = {kb * 1024, fmt::format("this node's {} (MemTotal)", format_bytes(kb * 1024.0))};
  if (int64_t limit = 0, usage = 0; cgroup_limit(&limit, &usage) && limit < b.bytes)
    b = {limit, fmt::format("the job's memory limit (its cgroup's, {})", format_bytes(double(limit)))};
  return b;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

void require_memory(double bytes, const std::string& what) {
  const MemoryBound b = memory_bound();
  if (bytes < 0 || bytes > double(b.bytes))
    fail_input("{} needs {}; {}", what,
               bytes < 0 ? std::string("more than 8 EiB") : format_bytes(bytes), b.source);
}

}  // namespace strata
