// Token shards: which files data.path names, their format, and their headers (token_shards.h).
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "config/config.h"
#include "data/token_shards.h"
#include "strata/error.h"

namespace strata {
namespace {

const unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// The first `n` bytes of a file (fewer if it is shorter); the OS's reason if it cannot be read.
std::string file_start(const std::string& file, size_t n) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_input("{}: cannot open ({})", file, std::strerror(errno));
  std::string buf(n, '\0');
  const ssize_t got = ::pread(fd, buf.data(), n, 0);
  const int err = errno;
  ::close(fd);
  if (got < 0) fail_input("{}: cannot read ({})", file, std::strerror(err));
  buf.resize(size_t(got));
  return buf;
}

int64_t file_size(const std::string& file) {
  struct stat sb{};
  if (::stat(file.c_str(), &sb) != 0) fail_input("{}: cannot open ({})", file, std::strerror(errno));
  return int64_t(sb.st_size);
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// What one file holds, by its first bytes and its name; "" for a .bin of none of the formats.
// Anything else is taken for HDF5, whose reader then says what is wrong with it.
std::string detect_format(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) return "hdf5";
  const std::string head = file_start(file, 8);
  if (head.size() == 8 && std::memcmp(head.data(), kHdf5Signature, 8) == 0) return "hdf5";
  int32_t magic = 0;
  if (head.size() >= 4) std::memcpy(&magic, head.data(), 4);
  if (magic == kLlmcShardMagic) return "llmc";
  const std::string name = std::filesystem::path(file).filename().string();
  if (name == "train.bin" || name == "val.bin") return "nanogpt";
  return name.size() > 4 && name.ends_with(".bin") ? "" : "hdf5";
}

std::string format_name(const std::string& f) {
  return f == "llmc" ? "an llm.c token shard" : f == "nanogpt" ? "nanoGPT's headerless uint16 tokens"
                                                                : "an HDF5 file";
}

// The token count of one shard, its header and size checked.
int64_t shard_tokens(const std::string& file, const std::string& format) {
  const int64_t size = file_size(file);
  if (format == "nanogpt") {
    if (size == 0) fail_input("{}: is empty; it holds no tokens", file);
    if (size % 2)
      fail_input("{}: has {} bytes, an odd number; nanoGPT's .bin holds uint16 tokens (2 bytes "
                 "each)", file, size);
    return size / 2;
  }
  if (size < kLlmcHeaderBytes)
    fail_input("{}: has {} bytes, fewer than the 1024 of an llm.c shard's header", file, size);
  int32_t header[3];
  std::memcpy(header, file_start(file, sizeof header).data(), sizeof header);
  if (header[0] != kLlmcShardMagic)
    fail_input("{}: magic {} in its header; an llm.c token shard has {}", file, header[0],
               kLlmcShardMagic);
  if (header[1] != 1)
    fail_input("{}: llm.c shard version {}; strata reads version 1 (uint16 tokens)", file, header[1]);
  if (header[2] <= 0) fail_input("{}: its header counts {} tokens; it holds no tokens", file, header[2]);
  const int64_t want = kLlmcHeaderBytes + 2 * int64_t(header[2]);
  if (size != want)
    fail_input("{}: has {} bytes, but its header counts {} tokens (1024 + 2 x {} = {} bytes)",
               file, size, header[2], header[2], want);
  return header[2];
}

// The validation split beside the train shards: `path` with the last "train" of its file name
// read as "val", when that names files (none: "").
std::string val_beside(const std::string& path) {
  if (!path.empty() && path[0] == '[') return "";
  const size_t slash = path.rfind('/');
  const size_t at = path.rfind("train");
  if (at == std::string::npos || (slash != std::string::npos && at < slash)) return "";
  const std::string val = path.substr(0, at) + "val" + path.substr(at + 5);
  if (has_glob_chars(val)) {
    glob_t g{};
    const bool any = ::glob(val.c_str(), GLOB_NOSORT, nullptr, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return any ? val : "";
  }
  std::error_code ec;
  return std::filesystem::is_regular_file(val, ec) ? val : "";
}

SplitInfo shard_split(const std::string& name, const std::vector<std::string>& files,
                      const std::string& format) {
  SplitInfo s;
  s.name = name;
  s.dataset = name == "train" ? "train split" : "val split";
  s.files = files;
  for (const auto& f : files) {
    s.file_tokens.push_back(shard_tokens(f, format));
    s.tokens += s.file_tokens.back();
  }
  return s;
}

}  // namespace

std::vector<std::string> data_files(const std::string& path, const std::string& key) {
  if (path.empty()) fail_input("{} is empty; expected a file, a list of files or a glob", key);
  if (path[0] == '[') {
    std::vector<std::string> files = toml_array_values(path, key);
    if (files.empty()) fail_input("{} = {}: an empty list of files", key, path);
    return files;
  }
  if (!has_glob_chars(path)) return {path};
  glob_t g{};
  const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  globfree(&g);
  if (rc == GLOB_NOMATCH || files.empty()) fail_input("{} = '{}': the glob matches no file", key, path);
  if (rc != 0) fail_input("{} = '{}': cannot read the directories of the glob", key, path);
  std::sort(files.begin(), files.end());  // by bytes, whatever the locale
  return files;
}

std::string data_format(const std::vector<std::string>& files, const std::string& format,
                        const std::string& key) {
  if (format != "auto") return format;
  std::string first;
  for (const auto& f : files) {
    const std::string got = detect_format(f);
    if (got.empty())
      fail_input("{}: cannot tell its format (no HDF5 signature, no llm.c magic {}, not named "
                 "train.bin or val.bin): set data.format = \"llmc\" or \"nanogpt\"", f,
                 kLlmcShardMagic);
    if (first.empty()) first = got;
    else if (got != first)
      fail_input("{}: {} is {} but {} is {}; one format per path", key, files[0],
                 format_name(first), f, format_name(got));
  }
  return first;
}

int64_t shard_header_bytes(const std::string& format) {
  return format == "llmc" ? kLlmcHeaderBytes : 0;
}

DatasetInfo open_token_shards(const std::string& path, const std::string& format,
                              const DataOptions& options) {
  DatasetInfo info;
  info.path = path;
  info.tokens = true;
  info.format = format;
  info.vocab = options.vocab > 0 ? options.vocab : kGpt2Vocab;
  info.classes = info.vocab;
  info.train = shard_split("train", data_files(path, "data.path"), format);
  const std::string val = options.val_path.empty() ? val_beside(path) : options.val_path;
  if (!val.empty()) {
    const std::vector<std::string> files = data_files(val, "data.val_path");
    const std::string got = data_format(files, options.format, "data.val_path");
    if (got != format)
      fail_input("data.val_path: {} is {} but data.path holds {}", files[0], format_name(got),
                 format_name(format));
    info.has_test = true;
    info.test = shard_split("test", files, format);
  }
  const int part = options.check_part, parts = std::max(1, options.check_parts);
  check_shard_tokens(info.train.files, info.train.file_tokens, format, info.vocab, part, parts);
  if (info.has_test)
    check_shard_tokens(info.test.files, info.test.file_tokens, format, info.vocab, part, parts);
  return info;
}

}  // namespace strata
