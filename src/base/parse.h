// Strict parsing of numbers a user wrote (flags, config values, environment variables).
// Strict means: the whole text is the number, in plain decimal; no "0x10", no "1e3" where an
// integer is meant, no NaN or infinity, nothing that overflows. Each returns nullopt and says
// why in `why` ("expected an integer, got '1e3'"), for the caller to prefix with what it read.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// [-]digits, within int64.
std::optional<int64_t> parse_int(std::string_view text, std::string* why);
// The name in `names` closest to `name` by edit distance when it is at most two edits away (a
// typo: "train.epoch" for "train.epochs"), else "".
std::string closest_name(std::string_view name, const std::vector<std::string>& names);
// A finite decimal number ("0.05", "1e-8", "-3"); NaN, inf and overflow are refused.
std::optional<double> parse_real(std::string_view text, std::string* why);

// A numeric range with a message a user can act on: "must be in [1, 4096], got 5000".
struct Range {
  double lo = -1e308, hi = 1e308;
  bool open_lo = false;  // lo itself excluded ("> 0")
  std::string describe() const;
  // "" if x is in range, else the message.
  std::string check(double x, std::string_view as_written) const;
};

// An integer environment variable in [lo, hi]; nullopt when unset or empty. Anything else
// throws UserError(kExitBadInput) naming the variable: "SLURM_CPUS_PER_TASK=5000: must be in
// [1, 1024]".
std::optional<int64_t> env_int(const char* name, int64_t lo, int64_t hi);
// A finite number; the same rules.
std::optional<double> env_real(const char* name, double lo, double hi);

}  // namespace strata
