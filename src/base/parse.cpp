#include "base/parse.h"

#include <algorithm>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

std::string quoted(std::string_view s) {
  constexpr size_t kShown = 40;  // a pasted megabyte must not become the error line
  std::string out;
  for (char c : s.substr(0, kShown))
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return fmt::format("'{}{}'", out, s.size() > kShown ? "..." : "");
}

std::string number_text(double x) { return fmt::format("{}", x); }

}  // namespace

std::optional<int64_t> parse_int(std::string_view text, std::string* why) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  auto [end, ec] = std::from_chars(b, e, v, 10);
  if (text.empty() || ec == std::errc::invalid_argument || end != e) {
    *why = fmt::format("expected an integer, got {}", quoted(text));
    return std::nullopt;
  }
  if (ec == std::errc::result_out_of_range) {
    *why = fmt::format("{} is out of range for a 64-bit integer", quoted(text));
    return std::nullopt;
  }
  return v;
}

std::optional<double> parse_real(std::string_view text, std::string* why) {
  double v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  // from_chars takes no leading '+', which users write ("+1e-3"); accept it.
  if (b != e && *b == '+' && b + 1 != e && *(b + 1) != '-') ++b;
  auto [end, ec] = std::from_chars(b, e, v, std::chars_format::general);
  if (text.empty() || ec == std::errc::invalid_argument || end != e) {
    *why = fmt::format("expected a number, got {}", quoted(text));
    return std::nullopt;
  }
  if (ec == std::errc::result_out_of_range) {
    *why = fmt::format("{} is out of range (it overflows or underflows)", quoted(text));
    return std::nullopt;
  }
  if (!std::isfinite(v)) {
    *why = fmt::format("must be a finite number, got {}", quoted(text));
    return std::nullopt;
  }
  return v;
}

std::string Range::describe() const {
  if (open_lo && hi >= 1e308) return fmt::format("> {}", number_text(lo));
  if (hi >= 1e308) return fmt::format(">= {}", number_text(lo));
  if (open_lo) return fmt::format("in ({}, {}]", number_text(lo), number_text(hi));
  return fmt::format("in [{}, {}]", number_text(lo), number_text(hi));
}

std::string Range::check(double x, std::string_view as_written) const {
  if (!std::isfinite(x) || x < lo || x > hi || (open_lo && x <= lo))
    return fmt::format("must be {}, got {}", describe(), as_written);
  return "";
}

std::optional<int64_t> env_int(const char* name, int64_t lo, int64_t hi) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  std::string why;
  auto v = parse_int(s, &why);
  if (!v) fail_input("environment variable {}={}: {}", name, quoted(s), why);
  if (*v < lo || *v > hi)
    fail_input("environment variable {}={}: must be in [{}, {}]", name, *v, lo, hi);
  return v;
}

std::optional<double> env_real(const char* name, double lo, double hi) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  std::string why;
  auto v = parse_real(s, &why);
  if (!v) fail_input("environment variable {}={}: {}", name, quoted(s), why);
  if (*v < lo || *v > hi)
    fail_input("environment variable {}={}: must be in [{}, {}]", name, s, number_text(lo),
               number_text(hi));
  return v;
}

std::string closest_name(std::string_view name, const std::vector<std::string>& names) {
  if (name.size() >= 200) return "";
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
        diag = up;
      }
    }
    return row[b.size()];
  };
  size_t best = 3;  // at most two edits away
  std::string out;
  for (const auto& n : names)
    if (size_t d = distance(name, n); d < best) best = d, out = n;
  return out;
}

}  // namespace strata
