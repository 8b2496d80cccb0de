#include "cli/commands.h"

#include <fmt/format.h>

#include "base/parse.h"

namespace strata::cli {

int threads_from(const CLI::Option* flag, int given) {
  if (flag->count()) return given;
  return int(env_int("SLURM_CPUS_PER_TASK", 1, kMaxThreads).value_or(1));
}

CLI::Validator int_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        std::string why;
        auto x = parse_int(v, &why);
        if (!x) return why;
        if (*x < lo || *x > hi) return fmt::format("must be in [{}, {}], got {}", lo, hi, *x);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}
CLI::Validator real_in(double lo, double hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        std::string why;
        auto x = parse_real(v, &why);
        if (!x) return why;
        if (*x < lo || *x > hi) return fmt::format("must be in [{}, {}], got {}", lo, hi, v);
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

}  // namespace strata::cli
