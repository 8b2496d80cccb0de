// Running another program without a shell: an argument vector, never a command line, so no
// value from a file, a flag or the environment is ever interpreted by a shell.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace strata {

// Runs argv[0] (looked up in PATH) with `argv`, stdin from /dev/null and stderr discarded,
// and returns the first `max_bytes` of its standard output when it exits with status 0 within
// `timeout_s` (it is killed after that). nullopt otherwise; `why` says what happened.
std::optional<std::string> run_program(const std::vector<std::string>& argv, double timeout_s,
                                       std::string* why, size_t max_bytes = 4096);

}  // namespace strata
