#include "base/read_guard.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "base/parse.h"

namespace strata {
namespace {

// What the fault handler needs, made before the read: it may only call async-signal-safe
// functions (write, rename, _exit).
struct FaultPlan {
  char path[4096], corrupt[4112];
  char renamed[8192], not_renamed[8192];  // the whole error line, either way
  bool quarantine = false;
  int exit_code = 1;
};
FaultPlan g_plan;
// The signals of a crash inside HDF5: a bad address, or glibc's abort on a heap HDF5 corrupted.
constexpr int kFaults[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
struct sigaction g_old[std::size(kFaults)];

void write_all(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    const ssize_t k = ::write(2, s, n);
    if (k <= 0) return;
    s += k, n -= size_t(k);
  }
}

extern "C" void on_read_fault(int) {
  const bool renamed = g_plan.quarantine && ::rename(g_plan.path, g_plan.corrupt) == 0;
  write_all(renamed ? g_plan.renamed : g_plan.not_renamed);
  ::_exit(g_plan.exit_code);
}

void plan_faults(const std::string& path, int exit_code, bool quarantine) {
  g_plan.quarantine = quarantine && path.size() < sizeof g_plan.path;
  g_plan.exit_code = exit_code;
  std::snprintf(g_plan.path, sizeof g_plan.path, "%s", path.c_str());
  std::snprintf(g_plan.corrupt, sizeof g_plan.corrupt, "%s.corrupt", g_plan.path);
  const std::string what = fmt::format("strata: error: {}: reading it crashed HDF5: its HDF5 "
                                       "structures are damaged", path);
  std::snprintf(g_plan.renamed, sizeof g_plan.renamed, "%s; renamed it %s (the next --resume "
                "auto takes the one before)\n", what.c_str(), g_plan.corrupt);
  std::snprintf(g_plan.not_renamed, sizeof g_plan.not_renamed, "%s%s\n", what.c_str(),
                quarantine ? "; could not rename it: move it away" : "");
  struct sigaction sa{};
  sa.sa_handler = on_read_fault;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (size_t i = 0; i < std::size(kFaults); ++i) sigaction(kFaults[i], &sa, &g_old[i]);
}

}  // namespace

ReadGuard::ReadGuard(std::string path, int64_t file_bytes, int exit_code, bool quarantine)
    : path_(std::move(path)), exit_code_(exit_code), quarantine_(quarantine) {
  double seconds = 60 + double(file_bytes) / 10e6;
  if (auto t = env_real("STRATA_TEST_READ_DEADLINE_S", 0.1, 1e6)) seconds = *t;
  plan_faults(path_, exit_code, quarantine);
  thread_ = std::thread([this, seconds] { watch(seconds); });
}

ReadGuard::~ReadGuard() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
  for (size_t i = 0; i < std::size(kFaults); ++i) sigaction(kFaults[i], &g_old[i], nullptr);
}

void ReadGuard::watch(double seconds) {
  std::unique_lock lock(mu_);
  if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
    return;
  std::string what = "";
  if (quarantine_) {
    const std::string to = path_ + ".corrupt";
    what = std::rename(path_.c_str(), to.c_str()) == 0
               ? fmt::format("; renamed it {} (the next --resume auto takes the one before)", to)
               : fmt::format("; could not rename it {}: move it away", to);
  }
  fmt::print(stderr, "strata: error: {}: reading it did not finish in {:.0f} s: its HDF5 "
             "structures are damaged (HDF5 loops on them){}\n", path_, seconds, what);
  std::fflush(stderr);
  std::_Exit(exit_code_);
}

}  // namespace strata
