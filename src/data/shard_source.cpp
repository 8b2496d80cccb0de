// Token shards as a TokenSource: ranged reads (pread) of the files of one split, which form one
// token stream in their order; a range may span files. Nothing is mapped, so the memory a rank
// uses is the ranges it asks for, whatever the shards' total size.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "data/token_shards.h"
#include "data/token_source.h"
#include "strata/error.h"

namespace strata {
namespace {

class ShardSource final : public TokenSource {
 public:
  ShardSource(const DatasetInfo& info, const SplitInfo& s)
      : files_(s.files), header_(shard_header_bytes(info.format)), fds_(s.files.size(), -1) {
    starts_.push_back(0);
    for (size_t f = 0; f < files_.size(); ++f) {
      starts_.push_back(starts_.back() + s.file_tokens[f]);
      struct stat sb{};
      if (::stat(files_[f].c_str(), &sb) != 0)
        fail_input("{}: cannot open ({})", files_[f], std::strerror(errno));
      if (int64_t(sb.st_size) != header_ + 2 * s.file_tokens[f])
        fail_input("{}: changed since it was opened (now {} bytes)", files_[f], int64_t(sb.st_size));
    }
  }
  ~ShardSource() override { close(); }

  void close() override {
    for (int& f : fds_)
      if (f >= 0) ::close(f), f = -1;
    open_ = 0;
  }

  size_t token_bytes() const override { return 2; }

  void read(const TokenRanges& ranges, unsigned char* dst) override {
    for (const auto& [first, last] : ranges) {
      // The file holding token `at`, then as much of the range as it holds.
      for (int64_t at = first; at < last;) {
        const size_t f = size_t(std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin()) - 1;
        const int64_t n = std::min(last, starts_[f + 1]) - at;
        read_file(f, at - starts_[f], n, dst);
        dst += n * 2;
        at += n;
      }
    }
  }

  std::string where(int64_t i) const override {
    const size_t f = size_t(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
    return fmt::format("{}: token at byte {}", files_[f], header_ + 2 * (i - starts_[f]));
  }

 private:
  // File f's descriptor, opened when first needed. A shard set may have more files than a
  // process may open (ulimit -n, often 1024), so at most kOpenFiles stay open.
  static constexpr int kOpenFiles = 64;
  int fd(size_t f) {
    if (fds_[f] >= 0) return fds_[f];
    if (open_ >= kOpenFiles) close();
    fds_[f] = ::open(files_[f].c_str(), O_RDONLY | O_CLOEXEC);
    if (fds_[f] < 0) fail_input("{}: cannot open ({})", files_[f], std::strerror(errno));
    ++open_;
    return fds_[f];
  }

  void read_file(size_t f, int64_t first, int64_t count, unsigned char* dst) {
    const int file = fd(f);
    size_t want = size_t(count) * 2, done = 0;
    while (done < want) {
      const ssize_t got = ::pread(file, dst + done, want - done,
                                  off_t(header_ + 2 * first + int64_t(done)));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail_input("{}: cannot read tokens {} to {} ({})", files_[f], first, first + count,
                   got < 0 ? std::strerror(errno) : "the file is shorter than when it was opened");
      done += size_t(got);
    }
  }

  std::vector<std::string> files_;
  int64_t header_;
  std::vector<int64_t> starts_;  // the stream position of each file's first token; then the total
  std::vector<int> fds_;  // -1: not open
  int open_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> open_shard_tokens(const DatasetInfo& info, const SplitInfo& s) {
  return std::make_unique<ShardSource>(info, s);
}

std::unique_ptr<TokenSource> open_token_source(const DatasetInfo& info, const SplitInfo& s) {
  return info.format == "hdf5" ? open_hdf5_tokens(info, s) : open_shard_tokens(info, s);
}

}  // namespace strata
