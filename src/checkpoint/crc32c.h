// CRC-32C (Castagnoli): the memory checkpoints' payload and header checksums. With SSE4.2's
// crc32 instruction where the CPU has it, three stripes at once (the instruction's latency is
// three cycles, its throughput one a cycle: one chain runs at a third of it), else by table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata {

// The CRC of n bytes (the usual pre- and post-inversion).
uint32_t crc32c(const void* data, size_t n);
// Register updates without the inversions: `reg` continued over n bytes at src; the copy form
// also copies them to dst on the way (src is read once).
uint32_t crc32c_update(uint32_t reg, const unsigned char* src, size_t n);
uint32_t crc32c_copy(uint32_t reg, char* dst, const unsigned char* src, size_t n);

}  // namespace strata
