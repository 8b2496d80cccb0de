#include "checkpoint/checkpoint_cache.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "base/job.h"
#include "strata/error.h"

namespace strata {
namespace {

constexpr size_t kChunk = 8 << 20;

// Reads all of fd from the start; CRC-32 of its bytes, or nullopt on a read error.
std::optional<uint32_t> crc_of_fd(int fd, std::vector<char>& buf, int64_t* bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), total);
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(n));
    total += n;
  }
  *bytes = total;
  return uint32_t(crc);
}

}  // namespace

std::string expand_local_dir(const std::string& local_dir) {
  std::string out;
  for (size_t i = 0; i < local_dir.size(); ++i) {
    if (local_dir[i] == '%' && i + 1 < local_dir.size() && local_dir[i + 1] == 'n') {
      out += slurm_node_name();
      ++i;
    } else {
      out += local_dir[i];
    }
  }
  return out;
}

std::string copy_verified(const std::string& src, const std::string& dst, int64_t* bytes) {
  const int in = ::open(src.c_str(), O_RDONLY);
  if (in < 0) return fmt::format("cannot open {} ({})", src, std::strerror(errno));
  const int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    return fmt::format("cannot create {} ({})", dst, std::strerror(err));
  }
  std::vector<char> buf(kChunk);
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t at = 0;
  std::string error;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0) { error = fmt::format("cannot read {} ({})", src, std::strerror(errno)); break; }
    if (n == 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(n));
    for (ssize_t done = 0; done < n && error.empty();) {
      const ssize_t w = ::pwrite(out, buf.data() + done, size_t(n - done), at + done);
      if (w <= 0) error = fmt::format("cannot write {} ({})", dst, std::strerror(errno));
      else done += w;
    }
    if (!error.empty()) break;
    // Start writeback as we go, so the fsync below has little left to do.
    ::sync_file_range(out, at, n, SYNC_FILE_RANGE_WRITE);
    at += n;
  }
  ::close(in);
  if (error.empty() && ::fsync(out) != 0) error = fmt::format("cannot flush {} ({})", dst, std::strerror(errno));
  if (error.empty()) {
    // Read back what the shared file system stored, not this node's page cache of it.
    ::posix_fadvise(out, 0, 0, POSIX_FADV_DONTNEED);
    const int back = ::open(dst.c_str(), O_RDONLY);
    int64_t read_bytes = 0;
    std::optional<uint32_t> again;
    if (back >= 0) {
      again = crc_of_fd(back, buf, &read_bytes);
      ::close(back);
    }
    if (!again) error = fmt::format("cannot read back {} ({})", dst, std::strerror(errno));
    else if (*again != uint32_t(crc) || read_bytes != at)
      error = fmt::format("{} read back differs from {} (crc32 {:08x} vs {:08x}, {} vs {} bytes)",
                          dst, src, *again, uint32_t(crc), read_bytes, at);
  }
  ::close(out);
  if (!error.empty()) ::unlink(dst.c_str());
  *bytes = at;
  return error;
}

SharedCopier::SharedCopier(std::string shared_dir, Publish publish)
    : shared_(std::move(shared_dir)), publish_(std::move(publish)),
      thread_([this] { run(); }) {}

SharedCopier::~SharedCopier() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SharedCopier::submit(const std::string& local_path, const std::string& name, int64_t step) {
  {
    std::lock_guard lk(mu_);
    waiting_ = Job{local_path, name, step};  // replaces an older one still waiting
  }
  cv_.notify_all();
}

std::vector<std::string> SharedCopier::drain() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !waiting_ && !busy_; });
  return std::exchange(failures_, {});
}

std::vector<std::string> SharedCopier::take_failures() {
  std::lock_guard lk(mu_);
  return std::exchange(failures_, {});
}

double SharedCopier::last_copy_s() const {
  std::lock_guard lk(mu_);
  return last_copy_s_;
}

void SharedCopier::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    // The destructor waits for the waiting copy too: the newest checkpoint must reach the
    // shared directory before the process ends.
    cv_.wait(lk, [&] { return waiting_ || stop_; });
    if (!waiting_) return;
    const Job job = std::move(*waiting_);
    waiting_.reset();
    busy_ = true;
    lk.unlock();
    copy(job);
    lk.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void SharedCopier::copy(const Job& job) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string final_path = shared_ + "/" + job.name;
  const std::string tmp = fmt::format("{}.tmp.{}", final_path, ::getpid());
  int64_t bytes = 0;
  std::string error = copy_verified(job.local_path, tmp, &bytes);
  if (error.empty()) {
    try {
      publish_file(tmp, final_path);
      publish_(job.name, job.step);
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lk(mu_);
  if (error.empty()) last_copy_s_ = s;
  else failures_.push_back(fmt::format("copying {} to checkpoint.dir {}: {}", job.local_path, shared_, error));
}

}  // namespace strata
