// Helpers for the [ranks] tests: multi-rank code run on in-process ranks (comm_threads.h).
// Catch2's assertions are not thread-safe, so ranks return what they saw and the test thread
// checks it.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm_threads.h"

namespace strata::test {

// f(comm) on ranks 0..n-1 (threads); its results by rank.
template <typename F>
auto on_ranks(int n, F f, const RanksOptions& opt = {}) {
  using Result = decltype(f(std::declval<Comm&>()));
  static_assert(!std::is_same_v<Result, bool>, "vector<bool> packs bits: the ranks would race");
  std::vector<Result> out(static_cast<size_t>(n));
  run_ranks(n, [&](Comm& c) { out[size_t(c.rank())] = f(c); }, opt);
  return out;
}

// The same bytes (floats compared bitwise: -0 is not 0, NaN equals the same NaN).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace strata::test
