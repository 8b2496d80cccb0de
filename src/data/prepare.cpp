// Fashion-MNIST IDX (gzip) and text files -> strata HDF5 (see prepare.h).
#include "data/prepare.h"

#include <fcntl.h>
#include <hdf5.h>
#include <openssl/evp.h>
#include <sched.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "base/job.h"
#include "base/memory.h"
#include "data/data.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer_identity.h"
#include "strata/error.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

namespace strata {
namespace {

namespace fs = std::filesystem;

// The four source files, in the order source_sha256 hashes them.
constexpr std::array<const char*, 4> kSources = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"};
constexpr int kClasses = 10;

// ---------------------------------------------------------------- SHA-256 (OpenSSL EVP)

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("OpenSSL: cannot initialise SHA-256");
  }
  void update(const void* p, size_t n) {
    if (EVP_DigestUpdate(ctx_.get(), p, n) != 1) throw std::runtime_error("OpenSSL: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1)
      throw std::runtime_error("OpenSSL: SHA-256 final failed");
    std::string out;
    for (unsigned i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// ---------------------------------------------------------------- IDX reading

struct Idx {
  std::vector<uint64_t> dims;
  std::vector<uint8_t> data;
};

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// Reads up to n bytes; fewer only at the end of the stream.
size_t gz_read(gzFile f, const std::string& path, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    unsigned chunk = unsigned(std::min<size_t>(n - got, 1u << 30));
    int r = gzread(f, static_cast<char*>(buf) + got, chunk);
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      fail_input("{}: cannot decompress ({})", path, code == Z_ERRNO ? std::strerror(errno) : msg);
    }
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

// An IDX file of unsigned bytes: magic 00 00 08 <ndims>, then ndims big-endian uint32 sizes,
// then the data, row-major.
Idx read_idx_gz(const std::string& path, int ndims) {
  errno = 0;
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) fail_input("{}: cannot open ({})", path, errno ? std::strerror(errno) : "out of memory");
  unsigned char head[4];
  if (gz_read(f.get(), path, head, 4) != 4) fail_input("{}: truncated IDX header", path);
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != ndims)
    fail_input("{}: bad IDX magic {:02x}{:02x}{:02x}{:02x}; expected 000008{:02x} (unsigned bytes, "
               "{} dimensions)",
               path, head[0], head[1], head[2], head[3], ndims, ndims);
  Idx idx;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    unsigned char b[4];
    if (gz_read(f.get(), path, b, 4) != 4) fail_input("{}: truncated IDX header", path);
    uint64_t v = uint64_t(b[0]) << 24 | uint64_t(b[1]) << 16 | uint64_t(b[2]) << 8 | b[3];
    if (v == 0) fail_input("{}: IDX dimension {} is 0", path, d);
    idx.dims.push_back(v);
    total *= v;
    if (total > (uint64_t(1) << 34)) fail_input("{}: implausible IDX dimensions", path);
  }
  require_memory(double(total), fmt::format("{}: {} bytes of IDX data", path, total));
  idx.data.resize(total);
  size_t got = gz_read(f.get(), path, idx.data.data(), total);
  if (got != total)
    fail_input("{}: truncated: header promises {} bytes of data, found {}", path, total, got);
  unsigned char extra;
  if (gz_read(f.get(), path, &extra, 1) != 0)
    fail_input("{}: unexpected bytes after the {} bytes of data", path, total);
  return idx;
}

struct Split {
  Idx images, labels;
};

Split read_split(const std::string& dir, const char* images_file, const char* labels_file) {
  std::string ip = (fs::path(dir) / images_file).string(), lp = (fs::path(dir) / labels_file).string();
  Split s{read_idx_gz(ip, 3), read_idx_gz(lp, 1)};
  if (s.images.dims[0] != s.labels.dims[0])
    fail_input("{}: has {} labels but {} has {} images", lp, s.labels.dims[0], ip,
               s.images.dims[0]);
  for (size_t i = 0; i < s.labels.data.size(); ++i)
    if (s.labels.data[i] >= kClasses)
      fail_input("{}: label[{}] = {} is out of range [0, {})", lp, i, s.labels.data[i], kClasses);
  return s;
}

// ---------------------------------------------------------------- HDF5 writing

// Default dataset creation properties: contiguous layout, so a row is one plain file read.
void write_u8(hid_t group, const char* name, const Idx& idx, const char* source_file) {
  std::vector<hsize_t> dims(idx.dims.begin(), idx.dims.end());
  H5Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  H5Id ds(H5_CHECK(H5Dcreate2(group, name, H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT)),
          H5Dclose);
  H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, idx.data.data()));
  write_str_attr(ds.get(), "source_file", source_file);
  if (dims.size() == 3) {
    write_int_attr(ds.get(), "channels", 1);
    write_int_attr(ds.get(), "height", int64_t(dims[1]));
    write_int_attr(ds.get(), "width", int64_t(dims[2]));
  }
}

void write_split(hid_t file, const char* name, const Split& s, const char* images_file,
                 const char* labels_file) {
  H5Id group(H5_CHECK(H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  write_u8(group.get(), "images", s.images, images_file);
  write_u8(group.get(), "labels", s.labels, labels_file);
}

struct Provenance {
  std::vector<std::string> digests;  // per kSources entry
  std::string combined;
};

void write_file(const std::string& path, const Split& train, const Split& test,
                const Provenance& prov) {
  std::lock_guard lock(hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) fail_input("{}: cannot create ({})", path, h5_error_detail());
  H5Id file(f, H5Fclose);
  write_split(f, "train", train, kSources[0], kSources[1]);
  write_split(f, "test", test, kSources[2], kSources[3]);
  write_int_attr(f, "classes", kClasses);
  write_str_attr(f, "source", "Fashion-MNIST (Debian dataset-fashion-mnist)");
  write_str_attr(f, "source_sha256", prov.combined);
  for (size_t i = 0; i < kSources.size(); ++i)
    write_str_attr(f, std::string("sha256_") + kSources[i], prov.digests[i]);
  write_str_attr(f, "created_by", "strata " STRATA_VERSION);
  write_str_attr(f, "created_at", utc_now_iso());
  H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
}

// ---------------------------------------------------------------- text

constexpr int kByteVocab = 256;

// A whole input file; UserError naming it if it is a directory, unreadable or empty.
std::string read_text_input(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail_input("{}: is a directory; --input takes files", path);
  if (const auto st = fs::status(path, ec).type();
      st == fs::file_type::character || st == fs::file_type::block || st == fs::file_type::socket)
    fail_input("{}: is a device or socket; --input takes files (or pipes)", path);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  // The text is held three times (the input, then its train and val parts): a file, or a
  // pipe or device that never ends (/dev/zero), must leave room for that.
  const double room = double(available_memory_bytes()) / 3;
  std::string data;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    data.append(buf.data(), n);
    if (double(data.size()) > room)
      fail_input("{}: more than {} of text; prepare text holds its inputs in memory, a third of "
                 "what is available", path, format_bytes(room));
  }
  if (std::ferror(f.get())) fail_input("{}: cannot read ({})", path, std::strerror(errno));
  if (data.empty()) fail_input("{}: is empty", path);
  return data;
}

// Entropy of the frequencies of the tokens in `tokens` (bytes or ids below `vocab`), in nats:
// -sum p ln p.
template <typename Tokens>
double unigram_entropy_nats(const Tokens& tokens, int vocab) {
  std::vector<int64_t> count(size_t(vocab), 0);
  for (auto t : tokens) ++count[size_t(static_cast<std::make_unsigned_t<decltype(t)>>(t))];
  const double n = double(tokens.size());
  double h = 0;
  for (int64_t c : count)
    if (c > 0) h -= double(c) / n * std::log(double(c) / n);
  return h;
}

struct TextCorpus {
  std::string train, val;                     // bytes
  std::vector<uint16_t> train_ids, val_ids;  // gpt2
  TokenizerAttrs tokenizer;                   // gpt2's identity; empty for bytes
  int vocab = kByteVocab;
  std::vector<std::string> names, digests;  // per input: basename, SHA-256
  std::string combined;                     // source_sha256
  std::string source;                       // the input paths
  double val_fraction = 0, entropy = 0;
};

void write_double_attr(hid_t obj, const char* name, double value) {
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value));
}

// /GROUP/tokens, uint8 (bytes) or uint16 (ids) (N,), contiguous (default creation properties).
void write_tokens(hid_t file, const char* group, const void* data, size_t n, bool u16) {
  H5Id g(H5_CHECK(H5Gcreate2(file, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  hsize_t dims = n;
  H5Id space(H5_CHECK(H5Screate_simple(1, &dims, nullptr)), H5Sclose);
  H5Id ds(H5_CHECK(H5Dcreate2(g.get(), "tokens", u16 ? H5T_STD_U16LE : H5T_STD_U8LE, space.get(),
                              H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
          H5Dclose);
  H5_CHECK(H5Dwrite(ds.get(), u16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL,
                    H5P_DEFAULT, data));
}

void write_text_file(const std::string& path, const TextCorpus& c) {
  std::lock_guard lock(hdf5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) fail_input("{}: cannot create ({})", path, h5_error_detail());
  H5Id file(f, H5Fclose);
  const bool ids = !c.tokenizer.empty();
  if (ids) {
    write_tokens(f, "train", c.train_ids.data(), c.train_ids.size(), true);
    write_tokens(f, "val", c.val_ids.data(), c.val_ids.size(), true);
  } else {
    write_tokens(f, "train", c.train.data(), c.train.size(), false);
    write_tokens(f, "val", c.val.data(), c.val.size(), false);
  }
  write_str_attr(f, "kind", "tokens");
  write_int_attr(f, "vocab", c.vocab);
  if (ids)
    write_tokenizer_attrs(f, c.tokenizer);
  else
    write_str_attr(f, "tokenizer", "bytes");
  write_int_attr(f, "train_tokens", int64_t(ids ? c.train_ids.size() : c.train.size()));
  write_int_attr(f, "val_tokens", int64_t(ids ? c.val_ids.size() : c.val.size()));
  write_double_attr(f, "val_fraction", c.val_fraction);
  write_double_attr(f, "unigram_entropy_nats", c.entropy);
  write_str_attr(f, "source", c.source);
  write_str_attr(f, "source_sha256", c.combined);
  for (size_t i = 0; i < c.names.size(); ++i)
    write_str_attr(f, "sha256_" + c.names[i], c.digests[i]);
  write_str_attr(f, "created_by", "strata " STRATA_VERSION);
  write_str_attr(f, "created_at", utc_now_iso());
  H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
}

// Writes `tmp` with `write` and publishes it as out_path; on any failure tmp is removed.
template <typename F>
void write_and_publish(const std::string& out_path, F&& write) {
  std::string tmp = fmt::format("{}.tmp.{}", out_path, ::getpid());
  try {
    try {
      write(tmp);
    } catch (const UserError&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(tmp + ": " + e.what());  // name the file in HDF5 failures
    }
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  publish_file(tmp, out_path);
}

void check_out_dir(const std::string& out_path) {
  fs::path out(out_path);
  fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_input("{}: output directory {} {}", out_path, dir.string(),
               fs::exists(dir, ec) ? "is not a directory" : "does not exist");
  if (fs::is_directory(out, ec)) fail_input("{}: is a directory; expected a file", out_path);
}

// ---------------------------------------------------------------- GPT-2 tokens

// The cores this process may run on.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// The tokenizer `tok` names, checked; nullopt for bytes.
std::optional<Gpt2Tokenizer> open_text_tokenizer(const TextTokenizer& tok) {
  if (tok.name == "bytes") {
    if (!tok.vocab_dir.empty())
      fail_input("--vocab {}: is for --tokenizer gpt2; --tokenizer bytes has no vocabulary", tok.vocab_dir);
    return std::nullopt;
  }
  if (tok.name != "gpt2") fail_input("--tokenizer {}: unknown; expected bytes or gpt2", tok.name);
  if (tok.vocab_dir.empty())
    fail_input("--tokenizer gpt2 needs --vocab DIR: the directory of GPT-2's encoder.json and "
               "vocab.bpe (or Hugging Face's vocab.json and merges.txt)");
  return Gpt2Tokenizer::load(tok.vocab_dir);
}

// Progress of encoding one input on stderr: a bar redrawn in place on a terminal, else a line
// every 10 s. Only for inputs of kMinBytes or more (a small one is done before it would show).
class EncodeProgress {
 public:
  static constexpr size_t kMinBytes = size_t(8) << 20;
  EncodeProgress(std::string name, size_t total)
      : name_(std::move(name)), total_(total), on_(total >= kMinBytes),
        tty_(::isatty(STDERR_FILENO) == 1), start_(now_s()) {}
  void operator()(size_t done) {
    if (!on_ || finished_) return;
    const double t = now_s() - start_;
    if (!tty_ && done < total_ && t < last_ + 10) return;
    last_ = t;
    finished_ = done >= total_;
    const double pct = 100.0 * double(done) / double(total_);
    const int filled = int(pct / 100 * 30);
    const std::string msg =
        fmt::format("prepare text: {} [{}{}] {:.0f}% of {:.1f} MB, {:.1f} MB/s", name_,
                    std::string(size_t(filled), '#'), std::string(size_t(30 - filled), '.'), pct,
                    double(total_) / 1e6, double(done) / 1e6 / std::max(t, 1e-3));
    std::fprintf(stderr, tty_ ? "\r%s%s" : "%s%s", msg.c_str(), tty_ && done < total_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  static double now_s() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  }
  std::string name_;
  size_t total_;
  bool on_, tty_, finished_ = false;
  double start_, last_ = 0;
};

// Encodes one document and appends its parts to the splits, <|endoftext|> between documents.
void add_gpt2_document(TextCorpus& c, const Gpt2Tokenizer& tok, const std::string& bytes,
                       const std::string& name, int threads) {
  EncodeProgress progress(name, bytes.size());
  const std::vector<int32_t> ids = tok.encode_parallel(bytes, threads, std::ref(progress));
  const size_t val = size_t(std::llround(c.val_fraction * double(ids.size())));
  const bool first = c.names.size() == 1;  // this document's name is in already
  auto append = [first](std::vector<uint16_t>& split, const int32_t* b, const int32_t* e) {
    if (!first) split.push_back(uint16_t(kGpt2EndOfText));  // even after an empty part
    split.insert(split.end(), b, e);  // ids < vocab_size <= 65536 (checked by the caller)
  };
  append(c.train_ids, ids.data(), ids.data() + (ids.size() - val));
  append(c.val_ids, ids.data() + (ids.size() - val), ids.data() + ids.size());
}

}  // namespace

PreparedText prepare_text(const std::vector<std::string>& inputs, const std::string& out_path,
                          double val_fraction, const TextTokenizer& tokenizer) {
  if (!(val_fraction > 0 && val_fraction < 1))
    fail_input("--val_fraction {}: expected a fraction strictly between 0 and 1", val_fraction);
  if (inputs.empty()) fail_input("prepare text: no --input files");
  check_out_dir(out_path);

  // Read and check everything before creating any file.
  TextCorpus c;
  c.val_fraction = val_fraction;
  const std::optional<Gpt2Tokenizer> gpt2 = open_text_tokenizer(tokenizer);
  const int threads = tokenizer.threads > 0 ? tokenizer.threads : usable_cores();
  if (gpt2) {
    if (gpt2->vocab_size() > 65536)
      fail_input("{}: {} tokens; prepare text writes uint16 ids, at most 65536", gpt2->files()[0],
                 gpt2->vocab_size());
    if (gpt2->vocab_size() <= kGpt2EndOfText)
      fail_input("{}: {} tokens; GPT-2's <|endoftext|> ({}) must be one of them", gpt2->files()[0],
                 gpt2->vocab_size(), kGpt2EndOfText);
    c.tokenizer = gpt2_tokenizer_attrs(*gpt2, tokenizer.vocab_dir);
    c.vocab = gpt2->vocab_size();
  }
  std::string listing;  // exactly what `sha256sum NAME...` prints, run in the inputs' directory
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = fs::path(inputs[i]).filename().string();
    for (size_t j = 0; j < i; ++j)
      if (c.names[j] == name)
        fail_input("{}: has the same file name as input {}; each input's sha256_{} attribute "
                   "needs a name of its own",
                   inputs[i], inputs[j], name);
    const std::string bytes = read_text_input(inputs[i]);
    Sha256 sha;
    sha.update(bytes.data(), bytes.size());
    c.names.push_back(name);
    c.digests.push_back(sha.hex());
    listing += fmt::format("{}  {}\n", c.digests.back(), name);
    c.source += (i ? " " : "") + inputs[i];
    if (gpt2) {
      add_gpt2_document(c, *gpt2, bytes, name, threads);
      continue;
    }
    // The last round(f * size) bytes of each input are validation.
    const size_t val = size_t(std::llround(val_fraction * double(bytes.size())));
    c.train.append(bytes, 0, bytes.size() - val);
    c.val.append(bytes, bytes.size() - val, val);
  }
  Sha256 combined;
  combined.update(listing.data(), listing.size());
  c.combined = combined.hex();
  const size_t n_train = gpt2 ? c.train_ids.size() : c.train.size();
  const size_t n_val = gpt2 ? c.val_ids.size() : c.val.size();
  for (const auto& [split, n] : {std::pair{"train", n_train}, std::pair{"val", n_val}})
    if (int64_t(n) < kMinTextSplitTokens)
      fail_input("{}: the {} split would hold {} tokens ({}) at --val_fraction {}; at least {} "
                 "are needed (a context of up to {} tokens): give more text{}",
                 out_path, split, n, gpt2 ? "GPT-2's" : "bytes", val_fraction, kMinTextSplitTokens,
                 kMinTextSplitTokens - 1,
                 split == std::string_view("val") ? " or a larger --val_fraction" : "");
  c.entropy = gpt2 ? unigram_entropy_nats(c.train_ids, c.vocab) : unigram_entropy_nats(c.train, c.vocab);

  write_and_publish(out_path, [&](const std::string& tmp) { write_text_file(tmp, c); });
  return {.train_tokens = int64_t(n_train), .val_tokens = int64_t(n_val), .vocab = c.vocab,
          .unigram_entropy_nats = c.entropy, .threads = gpt2 ? threads : 1};
}

std::string sha256_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) sha.update(buf.data(), n);
  if (std::ferror(f.get())) fail_input("{}: cannot read ({})", path, std::strerror(errno));
  return sha.hex();
}

void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_path) {
  check_out_dir(out_path);

  // Read and check everything before creating any file.
  Split train = read_split(source_dir, kSources[0], kSources[1]);
  Split test = read_split(source_dir, kSources[2], kSources[3]);
  if (train.images.dims[1] != test.images.dims[1] || train.images.dims[2] != test.images.dims[2])
    fail_input("{}: images are {}x{} but {} has {}x{}",
               (fs::path(source_dir) / kSources[2]).string(), test.images.dims[1],
               test.images.dims[2], kSources[0], train.images.dims[1], train.images.dims[2]);
  Provenance prov;
  std::string listing;  // exactly what `sha256sum FILES...` prints
  for (const char* name : kSources) {
    prov.digests.push_back(sha256_file((fs::path(source_dir) / name).string()));
    listing += fmt::format("{}  {}\n", prov.digests.back(), name);
  }
  Sha256 combined;
  combined.update(listing.data(), listing.size());
  prov.combined = combined.hex();

  write_and_publish(out_path, [&](const std::string& tmp) { write_file(tmp, train, test, prov); });
}

}  // namespace strata
