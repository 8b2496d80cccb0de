// A deadline for reading a file strata did not just write. A damaged HDF5 file can make
// HDF5 1.10 loop for ever inside a read: fuzz_checkpoint found a checkpoint whose global heap
// (where variable-length string attributes live) sends H5Aread into a loop that ran for 11
// minutes before it was killed (tests/fuzz/regressions/checkpoint). Nothing inside HDF5 can be
// interrupted safely, so when the deadline passes the process prints one line naming the file
// and exits: `quarantine` first renames the file to FILE.corrupt, so that the next
// `--resume auto` takes the checkpoint before it. Nothing else is written.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace strata {

class ReadDeadline {
 public:
  // Seconds allowed: 60 + one per 10 MB of the file (a slow shared file system), or
  // STRATA_TEST_READ_DEADLINE_S (tests). exit_code: what the process exits with.
  ReadDeadline(std::string path, int64_t file_bytes, int exit_code, bool quarantine);
  ~ReadDeadline();  // the read finished in time
  ReadDeadline(const ReadDeadline&) = delete;
  ReadDeadline& operator=(const ReadDeadline&) = delete;

 private:
  void watch(double seconds);
  std::string path_;
  int exit_code_;
  bool quarantine_;
  bool done_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace strata
