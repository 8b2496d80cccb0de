// Errors a user can cause, and the exit codes the sbatch scripts rely on.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace strata {

// Exit codes: a documented contract with slurm/*.sbatch (see docs/operations.md, "Exit codes").
enum ExitCode : int {
  kExitOk = 0,          // training finished
  kExitInternal = 1,    // a bug or an unexpected system failure
  kExitBadInput = 2,    // config, flags, data or files the user supplied are wrong
  kExitDiverged = 3,    // loss became NaN/Inf; nothing already written was replaced
  kExitBadCheckpoint = 4,  // checkpoints exist but none verifies, or they do not fit the run
  kExitHung = 5,        // the watchdog found a rank that stopped making progress
  kExitCheckpointsFailed = 6,  // training finished and model.h5 was written, but one or more
                               // checkpoint writes failed (each reported when it happened)
  kExitOutOfMemory = 7,  // an allocation failed after the memory check (another process took
                         // the memory, or an estimate fell short): named rank, what, size
  kExitResumable = 75,  // stopped early on purpose (signal/time limit); requeue (EX_TEMPFAIL)
};

// An error the user can fix. what() is one line naming the file, key or rank at fault.
struct UserError : std::runtime_error {
  int code;
  UserError(int exit_code, const std::string& msg) : std::runtime_error(msg), code(exit_code) {}
};

// Thrown on the ranks that agreed to stop because another rank hit a UserError; that rank has
// printed the message already, so these exit quietly with the same code.
struct AgreedFailure : UserError {
  using UserError::UserError;
};

template <typename... Args>
[[noreturn]] void fail_input(fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(kExitBadInput, fmt::format(f, std::forward<Args>(args)...));
}

// Internal invariant check: failure is a bug, reported with file and line.
#define STRATA_CHECK(cond, ...)                                                           \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw std::logic_error(fmt::format("{}:{}: check '{}' failed: {}", __FILE__,        \
                                         __LINE__, #cond, fmt::format(__VA_ARGS__)));     \
  } while (0)

}  // namespace strata
