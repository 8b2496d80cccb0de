// How much memory this process can still take, and refusing early what cannot fit: a model or
// a dataset sized by input is checked before anything is allocated, so it fails with a line
// naming what did not fit instead of std::bad_alloc, or the OOM killer hours later.
#pragma once
#include <cstdint>
#include <string>

namespace strata {

// Bytes this process may still allocate: the kernel's MemAvailable, capped by the cgroup's
// limit less its usage (cgroup v2 memory.max, or v1 memory.limit_in_bytes).
int64_t available_memory_bytes();

// "1.5 GiB", "12.0 MiB", "980 B".
std::string format_bytes(double bytes);

// Throws UserError(kExitBadInput) "WHAT needs 11.4 TiB; this node has 22.1 GiB available"
// when `bytes` is more than is available (or overflowed: negative).
void require_memory(double bytes, const std::string& what);

}  // namespace strata
