#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

extern char** environ;

namespace strata {

std::optional<std::string> run_program(const std::vector<std::string>& argv, double timeout_s,
                                       std::string* why, size_t max_bytes) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    *why = fmt::format("pipe: {}", std::strerror(errno));
    return std::nullopt;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  // The child must not inherit strata's blocked stop signals (job.cpp blocks USR1 and TERM).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  if (err != 0) {
    ::close(out[0]);
    *why = fmt::format("cannot run {}: {}", argv[0], std::strerror(err));
    return std::nullopt;
  }
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool timed_out = false;
  for (char buf[512];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
    const int r = ::poll(&p, 1, int(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of its output
    if (text.size() < max_bytes) text.append(buf, std::min(size_t(n), max_bytes - text.size()));
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    *why = fmt::format("{} did not answer within {:.0f} s", argv[0], timeout_s);
    return std::nullopt;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *why = fmt::format("{} failed ({})", argv[0],
                       WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                                         : fmt::format("signal {}", WTERMSIG(status)));
    return std::nullopt;
  }
  return text;
}

}  // namespace strata
