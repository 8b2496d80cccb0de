// How much memory this process can still take, refusing early what cannot fit, and reporting
// what does not fit anyway: a model or a dataset sized by input is checked before anything is
// allocated, so it fails with a line naming what did not fit instead of std::bad_alloc, or the
// OOM killer hours later; an allocation that fails past the check (another process took the
// memory) is an out-of-memory error naming the rank, what was being allocated and its size.
#pragma once
#include <cstdint>
#include <new>
#include <string>

namespace strata {

// What bounds this process's allocations: the smallest of the node's MemAvailable, the
// cgroup's limit less its usage (a Slurm job's --mem: cgroup v2 memory.max, v1
// memory.limit_in_bytes), and the address-space and data-segment limits less what is in use
// (ulimit -v: RLIMIT_AS against VmSize; ulimit -d: RLIMIT_DATA against VmData). `source`
// says which, for messages: "this node has 22.1 GiB available", "the job's memory limit
// (cgroup memory.max 4.0 GiB, 1.2 GiB in use) leaves 2.8 GiB", ...
struct MemoryBound {
  int64_t bytes = 0;
  std::string source;
};
MemoryBound memory_bound();
// memory_bound().bytes.
int64_t available_memory_bytes();
// What the node (or the job) holds in all, not what is left now: the node's MemTotal, or the
// job's cgroup limit when smaller. What a planner divides among the ranks of a node.
MemoryBound node_memory_limit();

// "1.5 GiB", "12.0 MiB", "980 B".
std::string format_bytes(double bytes);

// Throws UserError(kExitBadInput) "WHAT needs 11.4 TiB; this node has 22.1 GiB available" (or
// the bound that is smaller: memory_bound's source) when `bytes` is more than is available
// (or overflowed: negative).
void require_memory(double bytes, const std::string& what);

// ---- Out of memory past the check (src/base/out_of_memory.cpp) -------------------------------
// Every C++ allocation of the process (operator new is replaced) and every host tensor that
// fails throws OutOfMemory, whose what() is "could not allocate 12.0 GiB while building the
// model" (the innermost AllocationScope of the thread). main reports it as out of memory
// (exit kExitOutOfMemory) on every command; catch sites that turn errors into messages keep
// its what(). No allocation happens while it is thrown or read.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(size_t bytes);
  const char* what() const noexcept override { return text_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  char text_[256];
};

// Names what this thread allocates for the extent of a scope ("building the model"); nested
// scopes name the innermost. Not owning: `what` must outlive the scope.
class AllocationScope {
 public:
  explicit AllocationScope(const char* what);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

 private:
  const char* prev_;
};

// Tests: STRATA_TEST_FAIL_ALLOCATION=BYTES[:SCOPE] makes every allocation of at least BYTES
// (within an AllocationScope whose label holds SCOPE) fail as if the memory were gone, once a
// command runs (main arms it: arm_allocation_failures).
// check_allocation throws OutOfMemory for such a request; host tensors and operator new call it.
void arm_allocation_failures(bool on = true);
void check_allocation(size_t bytes);

}  // namespace strata
