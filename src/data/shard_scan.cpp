// Token shards: every token checked against the vocabulary before training starts, read in
// chunks by all the cores (token_shards.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "data/token_shards.h"
#include "strata/error.h"

namespace strata {
namespace {

// 1 MiB of uint16 per read: large enough for the disk, small enough that a thread per core of a
// large node adds little to the peak memory.
constexpr int64_t kChunkTokens = int64_t(1) << 19;

struct Chunk {
  size_t file;
  int64_t first, count;  // tokens within the file
};

// The first failure of a scan in stream order (chunks are numbered in it), whichever thread
// found it: the message the user sees does not depend on the threads' timing.
struct FirstFailure {
  std::mutex m;
  std::atomic<size_t> chunk{std::numeric_limits<size_t>::max()};
  std::string message;
  void report(size_t c, std::string msg) {
    std::lock_guard lock(m);
    if (c < chunk.load()) chunk = c, message = std::move(msg);
  }
};

// Reads chunk c into buf; "" or why not. Each chunk opens its file: a shard set may have more
// files than a process may hold open.
std::string read_chunk(const std::string& file, const Chunk& c, int64_t header,
                       std::vector<uint16_t>& buf) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("{}: cannot open ({})", file, std::strerror(errno));
  buf.resize(size_t(c.count));
  auto* p = reinterpret_cast<char*>(buf.data());
  size_t want = size_t(c.count) * 2, done = 0;
  while (done < want) {
    const ssize_t got = ::pread(fd, p + done, want - done, off_t(header + c.first * 2 + int64_t(done)));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "it is shorter than when opened";
      ::close(fd);
      return fmt::format("{}: cannot read ({})", file, why);
    }
    done += size_t(got);
  }
  ::close(fd);
  return "";
}

}  // namespace

void check_shard_tokens(const std::vector<std::string>& files, const std::vector<int64_t>& tokens,
                        const std::string& format, int64_t vocab, int part, int parts) {
  if (vocab > std::numeric_limits<uint16_t>::max()) return;  // every uint16 is a valid id
  const int64_t header = shard_header_bytes(format);
  std::vector<Chunk> chunks;
  size_t i = 0;
  for (size_t f = 0; f < files.size(); ++f)
    for (int64_t at = 0; at < tokens[f]; at += kChunkTokens, ++i)
      if (int(i % size_t(parts)) == part) chunks.push_back({f, at, std::min(kChunkTokens, tokens[f] - at)});
  FirstFailure fail;
  std::atomic<size_t> next{0};
  auto scan = [&] {
    std::vector<uint16_t> buf;
    for (size_t c; (c = next++) < chunks.size() && c < fail.chunk.load();) {
      const Chunk& ch = chunks[c];
      if (std::string why = read_chunk(files[ch.file], ch, header, buf); !why.empty()) {
        fail.report(c, why);
        continue;
      }
      // The maximum first (vectorised), the position only in the rare bad chunk.
      if (*std::max_element(buf.begin(), buf.end()) < vocab) continue;
      const auto bad = std::find_if(buf.begin(), buf.end(), [&](uint16_t t) { return t >= vocab; });
      const int64_t i = ch.first + (bad - buf.begin());
      fail.report(c, fmt::format("{}: token at byte {} = {} is out of range [0, {}) (model.vocab, "
                                 "or GPT-2's {} for token shards)", files[ch.file], header + 2 * i,
                                 *bad, vocab, kGpt2Vocab));
    }
  };
  const size_t threads = std::min<size_t>({chunks.size(), 16,
                                           std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(scan);
  scan();
  for (auto& t : pool) t.join();
  if (fail.chunk.load() != std::numeric_limits<size_t>::max()) fail_input("{}", fail.message);
}

}  // namespace strata
