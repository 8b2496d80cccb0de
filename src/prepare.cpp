// Fashion-MNIST IDX (gzip) -> strata HDF5 (see prepare.h).
#include "strata/prepare.h"

#include <fcntl.h>
#include <hdf5.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/data.h"
#include "strata/error.h"
#include "strata/files.h"
#include "strata/job.h"
#include "hdf5_util.h"

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

}  // namespace

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
  fs::path out(out_path);
  fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_input("{}: output directory {} does not exist", out_path, dir.string());

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

  std::string tmp = fmt::format("{}.tmp.{}", out_path, ::getpid());
  try {
    try {
      write_file(tmp, train, test, prov);
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

}  // namespace strata
