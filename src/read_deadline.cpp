#include "strata/read_deadline.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "strata/parse.h"

namespace strata {

ReadDeadline::ReadDeadline(std::string path, int64_t file_bytes, int exit_code, bool quarantine)
    : path_(std::move(path)), exit_code_(exit_code), quarantine_(quarantine) {
  double seconds = 60 + double(file_bytes) / 10e6;
  if (auto t = env_real("STRATA_TEST_READ_DEADLINE_S", 0.1, 1e6)) seconds = *t;
  thread_ = std::thread([this, seconds] { watch(seconds); });
}

ReadDeadline::~ReadDeadline() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void ReadDeadline::watch(double seconds) {
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
