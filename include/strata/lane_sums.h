// Lane sums: the checksum of a memory checkpoint that the optimizer's update writes itself
// (run/memory_state.h), cheap enough to add to the update's own loop, where a CRC-32C's one
// instruction per 8 bytes would cost more than the update's memory traffic.
//
// The words (a float's bits as uint32) in blocks of 16, a last partial block padded with
// zeros. For lane l of every block J: a[l] = sum of the words, b[l] = sum of (J + 1) * word,
// both mod 2^32 (Fletcher's two sums, per lane). A changed word changes a[l] (the difference
// of two distinct 32-bit words is never 0 mod 2^32); words swapped between blocks change b[l].
// Weaker than a CRC against several errors at once: two flipped bits of one lane can cancel
// in both sums (the sign bits of blocks J and K with J + K even, say), which CRC-32C never
// misses.
// The sums add over pieces, in any order, so an update in ranges (during backward) adds each
// range's as it goes.
//
// A kernel keeps running sums (s1, s2: after each block, s1 += block, s2 += s1) over one piece,
// then lane_sums_add() places the piece at its block.
#pragma once
#include <cstdint>
#include <cstring>

namespace strata {

constexpr int kSumLanes = 16;
constexpr int kRunningWords = 2 * kSumLanes;  // s1 then s2, per output array

// Continues running sums `run` (s1 then s2) over x[0, n): the reference the vectorised loops
// match. Every call but a piece's last must cover whole blocks.
inline void lane_sums_run(const float* x, int64_t n, uint32_t* run) {
  uint32_t* s1 = run;
  uint32_t* s2 = run + kSumLanes;
  for (int64_t i = 0; i < n; i += kSumLanes) {
    uint32_t w[kSumLanes] = {};
    std::memcpy(w, x + i, sizeof(float) * size_t(n - i < kSumLanes ? n - i : kSumLanes));
    for (int l = 0; l < kSumLanes; ++l) {
      s1[l] += w[l];
      s2[l] += s1[l];
    }
  }
}

// A piece's running sums over `blocks` blocks, its first at block `first` of the whole: into
// the whole's a (total[0, 16)) and b (total[16, 32)). sum (first + j + 1) w_j over the piece's
// blocks j is (first + 1 + blocks) * s1 - s2, since s2 = sum (blocks - j) w_j.
inline void lane_sums_add(uint32_t* total, const uint32_t* run, int64_t blocks, int64_t first) {
  const uint32_t k = uint32_t(first + 1 + blocks);
  for (int l = 0; l < kSumLanes; ++l) {
    total[l] += run[l];
    total[kSumLanes + l] += k * run[l] - run[kSumLanes + l];
  }
}

// The blocks of n words, a last partial one included.
inline int64_t lane_blocks(int64_t n) { return (n + kSumLanes - 1) / kSumLanes; }

// The sums of x[0, n) whose first word is at block `first` of the whole, into the whole's
// `total` (a, b).
inline void lane_sums_place(uint32_t* total, const float* x, int64_t n, int64_t first) {
  uint32_t run[kRunningWords] = {};
  lane_sums_run(x, n, run);
  lane_sums_add(total, run, lane_blocks(n), first);
}

}  // namespace strata
