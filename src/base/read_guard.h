// A guard around reading a file strata did not just write (a checkpoint, a parameter file, a
// dataset). HDF5 1.10 trusts a file's structures: fuzz_checkpoint found damaged checkpoints
// whose global heap (where variable-length string attributes live) sends H5Aread into a loop
// that ran 11 minutes before it was killed, or into a memcpy of a garbage length that
// segfaults (tests/fuzz/hangs, tests/fuzz/crashes). Nothing inside HDF5 can be interrupted or
// recovered safely, so while a guard is alive:
//  - a deadline (60 s + 1 s per 10 MB of the file) that passes, or
//  - a crash in this process (SIGSEGV, SIGBUS, SIGFPE, SIGILL; SIGABRT: glibc aborts when it
//    finds a heap HDF5 wrote past)
// ends the process with one line naming the file and `exit_code`; with `quarantine` the file
// is first renamed FILE.corrupt, so that the next `--resume auto` takes the checkpoint before
// it. Nothing else is written. One guard at a time (reads hold hdf5_mutex()).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace strata {

class ReadGuard {
 public:
  // The deadline is STRATA_TEST_READ_DEADLINE_S seconds instead when set (tests).
  ReadGuard(std::string path, int64_t file_bytes, int exit_code, bool quarantine);
  ~ReadGuard();  // the read finished: the fault handlers are restored
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

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
