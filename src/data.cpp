// Datasets in HDF5 and the per-rank batch loader (see data.h).
#include "strata/data.h"

#include <hdf5.h>
#include <sys/stat.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/error.h"
#include "strata/read_deadline.h"
#include "strata/memory.h"
#include "strata/parse.h"
#include "strata/rng.h"
#include "hdf5_util.h"

namespace strata {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

namespace {

// ---------------------------------------------------------------- HDF5 plumbing

// An HDF5 call that fails on a data file (H5_CHECK) means the file is damaged or cannot be
// read: the user's to fix, named, exit 2 (fuzzing found such files reported as internal errors).
// UserErrors already name the file.
template <typename F>
auto with_file_context(const std::string& path, F&& f) {
  try {
    return f();
  } catch (const UserError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw UserError(kExitBadInput, fmt::format("{}: damaged or unreadable HDF5 file ({})", path, e.what()));
  }
}

std::string dtype_name(hid_t t) {
  size_t bits = 8 * H5Tget_size(t);
  switch (H5Tget_class(t)) {
    case H5T_INTEGER: return fmt::format("{}int{}", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT: return fmt::format("float{}", bits);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    default: return "unknown";
  }
}

bool is_u8(hid_t t) {
  return H5Tget_class(t) == H5T_INTEGER && H5Tget_size(t) == 1 && H5Tget_sign(t) == H5T_SGN_NONE;
}
bool is_f32(hid_t t) { return H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 4; }

std::string dims_str(const std::vector<hsize_t>& d) {
  return shape_str(Shape(d.begin(), d.end()));
}

// Reading scattered rows of a contiguous dataset: HDF5's default 64 KiB sieve buffer would
// read 64 KiB per row (0.7 ms for 64 Fashion-MNIST rows); without one each run of rows is one
// read of its own size (0.05 ms).
H5Id no_sieve_fapl() {
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  H5_CHECK(H5Pset_sieve_buf_size(fapl.get(), 0));
  return fapl;
}

H5Id open_h5(const std::string& path) {
  // Check readability first, so a missing file reports the OS reason rather than HDF5's.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail_input("{}: is a directory, not an HDF5 file", path);
  if (FILE* f = std::fopen(path.c_str(), "rb"))
    std::fclose(f);
  else
    fail_input("{}: cannot open ({})", path, std::strerror(errno));
  if (H5Fis_hdf5(path.c_str()) <= 0) fail_input("{}: not an HDF5 file", path);
  H5Id fapl = no_sieve_fapl();
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (f < 0) fail_input("{}: cannot open as HDF5 ({})", path, h5_error_detail());
  return H5Id(f, H5Fclose);
}

// H5Lexists needs every parent to exist (and be a group), so walk the path one link at a time.
bool link_exists(hid_t file, const std::string& name) {
  std::string sofar;
  size_t pos = 1;
  while (pos <= name.size()) {
    size_t end = std::min(name.find('/', pos), name.size());
    if (!sofar.empty()) {
      H5Id parent(H5_CHECK(H5Oopen(file, sofar.c_str(), H5P_DEFAULT)), H5Oclose);
      if (H5Iget_type(parent.get()) != H5I_GROUP) return false;
    }
    sofar = name.substr(0, end);
    if (H5_CHECK(H5Lexists(file, sofar.c_str(), H5P_DEFAULT)) <= 0) return false;
    pos = end + 1;
  }
  return true;
}

// dst[i] = src[i] / 255 in float, correctly rounded: the reference.
void u8_to_unit_float_div(float* dst, const unsigned char* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float(src[i]) / 255.0f;
}

#if defined(__x86_64__)
// The same bits without a division (in memory mode a batch is converted on the training
// thread, and divps made this 15 us of a 64-row batch): q = x * (1/255) is off by an ulp for
// about half of the 256 values; one FMA step, q + (x - 255 q) / 255 with the exact residual
// x - 255 q, rounds every one of them as the division does (checked for all 256 at first use).
__attribute__((target("avx512f"))) void u8_to_unit_float_fma(float* dst, const unsigned char* src,
                                                             int64_t n) {
  const __m512 c = _mm512_set1_ps(1.0f / 255.0f), k = _mm512_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    // (maskz forms: GCC 12 warns about the "undefined" pass-through of the plain ones)
    const __m512 x = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepu8_epi32(0xFFFF, b));
    const __m512 q = _mm512_mul_ps(x, c);
    const __m512 r = _mm512_fnmadd_ps(q, k, x);  // x - q*255, exact
    _mm512_storeu_ps(dst + i, _mm512_fmadd_ps(r, c, q));
  }
  u8_to_unit_float_div(dst + i, src + i, n - i);
}

// True if the FMA version gives the division's bits for every byte value on this CPU.
bool fma_conversion_exact() {
  if (!__builtin_cpu_supports("avx512f")) return false;
  unsigned char all[256];
  float a[256], b[256];
  for (int v = 0; v < 256; ++v) all[v] = static_cast<unsigned char>(v);
  u8_to_unit_float_div(a, all, 256);
  u8_to_unit_float_fma(b, all, 256);
  return std::memcmp(a, b, sizeof a) == 0;
}
#endif

// dst[i] = src[i] / 255 (uint8 pixels to [0, 1]), bitwise as the division.
void u8_to_unit_float(float* dst, const unsigned char* src, int64_t n) {
#if defined(__x86_64__)
  static const bool fma_ok = fma_conversion_exact();
  if (fma_ok) return u8_to_unit_float_fma(dst, src, n);
#endif
  u8_to_unit_float_div(dst, src, n);
}

// Splits up to this many MiB of image data per rank are read into memory whole (see Loader);
// STRATA_DATA_CACHE_MB overrides it (0: always read batch by batch from the file).
constexpr int64_t kDefaultCacheMiB = 512;

int64_t cache_budget_bytes() {
  // MiB; 0 disables the cache. At most 1 TiB, so the byte count cannot overflow.
  return env_int("STRATA_DATA_CACHE_MB", 0, int64_t(1) << 20).value_or(kDefaultCacheMiB) << 20;
}

struct Dataset {
  std::string name;  // "/train/images"
  H5Id id, type;
  std::vector<hsize_t> dims;
};

Dataset open_ds(const std::string& path, hid_t file, const std::string& name) {
  if (!link_exists(file, name)) fail_input("{}: missing dataset {}", path, name);
  Dataset ds;
  ds.name = name;
  ds.id = H5Id(H5_CHECK(H5Oopen(file, name.c_str(), H5P_DEFAULT)), H5Oclose);
  if (H5Iget_type(ds.id.get()) != H5I_DATASET) fail_input("{}: {} is not a dataset", path, name);
  ds.type = H5Id(H5_CHECK(H5Dget_type(ds.id.get())), H5Tclose);
  H5Id space(H5_CHECK(H5Dget_space(ds.id.get())), H5Sclose);
  int nd = H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
  ds.dims.resize(nd);
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), ds.dims.data(), nullptr));
  return ds;
}

// Reads the whole (small) label dataset as int64; HDF5 converts from the stored integer type.
std::vector<int64_t> read_labels(const Dataset& ds) {
  std::vector<int64_t> v(ds.dims[0]);
  if (!v.empty())
    H5_CHECK(H5Dread(ds.id.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  return v;
}

// float32 images must be finite: a NaN pixel would surface as a diverged loss blaming
// train.lr (or, in /test, as a NaN test loss). Read a few MiB of rows at a time.
void check_finite_images(const std::string& path, const Dataset& im, int64_t sample_elems) {
  const hsize_t n = im.dims[0];
  const hsize_t chunk = std::max<hsize_t>(1, hsize_t((int64_t(4) << 20) / sample_elems));
  std::vector<float> buf(size_t(std::min(chunk, n) * hsize_t(sample_elems)));
  H5Id file_space(H5_CHECK(H5Dget_space(im.id.get())), H5Sclose);
  const int rank = int(im.dims.size());
  for (hsize_t at = 0; at < n; at += chunk) {
    std::vector<hsize_t> start(size_t(rank), 0), count = im.dims;
    start[0] = at;
    count[0] = std::min(chunk, n - at);
    H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                 count.data(), nullptr));
    H5Id mem(H5_CHECK(H5Screate_simple(rank, count.data(), nullptr)), H5Sclose);
    H5_CHECK(H5Dread(im.id.get(), H5T_NATIVE_FLOAT, mem.get(), file_space.get(), H5P_DEFAULT,
                     buf.data()));
    const int64_t elems = int64_t(count[0]) * sample_elems;
    for (int64_t i = 0; i < elems; ++i)
      if (!std::isfinite(buf[size_t(i)]))
        fail_input("{}: {} sample {} holds {} (element {}); images must be finite", path,
                   im.name, int64_t(at) + i / sample_elems,
                   std::isnan(buf[size_t(i)]) ? "NaN" : "Inf", i % sample_elems);
  }
}

// One split, validated: its images dataset stays open (the Loader reads rows from it).
struct Split {
  SplitInfo info;
  Dataset images;
  std::vector<int64_t> labels;
};

Split read_split(const std::string& path, hid_t file, const std::string& name) {
  Split s;
  s.info.name = name;
  s.images = open_ds(path, file, "/" + name + "/images");
  Dataset labels = open_ds(path, file, "/" + name + "/labels");
  const Dataset& im = s.images;
  hid_t it = im.type.get(), lt = labels.type.get();
  if (!is_u8(it) && !is_f32(it))
    fail_input("{}: {} has dtype {}; expected uint8 or float32", path, im.name, dtype_name(it));
  if (im.dims.size() != 3 && im.dims.size() != 4)
    fail_input("{}: {} has shape {}; expected (N, H, W) or (N, C, H, W)", path, im.name,
               dims_str(im.dims));
  if (H5Tget_class(lt) != H5T_INTEGER)
    fail_input("{}: {} has dtype {}; expected an integer type (uint8, int32 or int64)", path,
               labels.name, dtype_name(lt));
  if (labels.dims.size() != 1)
    fail_input("{}: {} has shape {}; expected (N,)", path, labels.name, dims_str(labels.dims));
  if (labels.dims[0] != im.dims[0])
    fail_input("{}: {} has {} rows but {} has {}", path, labels.name, labels.dims[0], im.name,
               im.dims[0]);
  if (im.dims[0] == 0) fail_input("{}: {} has no rows", path, im.name);
  if (std::count(im.dims.begin(), im.dims.end(), hsize_t(0)))
    fail_input("{}: {} has shape {}; a sample must not be empty", path, im.name, dims_str(im.dims));
  // Sizes reach int arithmetic in the kernels, and allocations: a sample's element count must
  // fit an int, and the labels must fit in memory (a file can claim any row count).
  int64_t sample_elems = 1;
  for (size_t d = 1; d < im.dims.size(); ++d)
    sample_elems = im.dims[d] > hsize_t(INT32_MAX) ? int64_t(INT32_MAX) + 1
                                                   : std::min<int64_t>(sample_elems * int64_t(im.dims[d]), int64_t(INT32_MAX) + 1);
  if (sample_elems > INT32_MAX)
    fail_input("{}: {} has shape {}; a sample of more than 2^31 - 1 elements is not supported",
               path, im.name, dims_str(im.dims));
  if (im.dims[0] > hsize_t(INT64_MAX / 8))
    fail_input("{}: {} claims {} rows", path, im.name, im.dims[0]);
  require_memory(double(im.dims[0]) * 8, fmt::format("{}: {} ({} rows)", path, labels.name, im.dims[0]));
  s.info.n = int64_t(im.dims[0]);
  s.info.sample_shape.assign(im.dims.begin() + 1, im.dims.end());
  if (s.info.sample_shape.size() == 2) s.info.sample_shape.insert(s.info.sample_shape.begin(), 1);
  s.info.images_u8 = is_u8(it);
  s.labels = read_labels(labels);
  if (!s.info.images_u8) check_finite_images(path, im, sample_elems);
  return s;
}

void check_labels(const std::string& path, const std::string& split,
                  const std::vector<int64_t>& labels, int64_t classes) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      fail_input("{}: /{}/labels[{}] = {} is out of range [0, {})", path, split, i, labels[i],
                 classes);
}

// ---------------------------------------------------------------- token files

// Batches carry token ids as float32, exact up to 2^24.
constexpr int64_t kMaxVocab = int64_t(1) << 24;

// uint8, uint16 or int32: what a token dataset may hold.
bool is_token_type(hid_t t) {
  if (H5Tget_class(t) != H5T_INTEGER) return false;
  const size_t size = H5Tget_size(t);
  const bool unsigned_ = H5Tget_sign(t) == H5T_SGN_NONE;
  return (size == 1 && unsigned_) || (size == 2 && unsigned_) || (size == 4 && !unsigned_);
}

// The native type tokens of `bytes` bytes are read as (the stored width: no conversion).
hid_t token_mem_type(size_t bytes) {
  return bytes == 1 ? H5T_NATIVE_UINT8 : bytes == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_INT32;
}

// A token dataset, validated: dtype, rank, not empty.
Dataset open_tokens(const std::string& path, hid_t file, const std::string& name) {
  Dataset ds = open_ds(path, file, name);
  if (!is_token_type(ds.type.get()))
    fail_input("{}: {} has dtype {}; expected uint8, uint16 or int32", path, name,
               dtype_name(ds.type.get()));
  if (ds.dims.size() != 1)
    fail_input("{}: {} has shape {}; expected (N,)", path, name, dims_str(ds.dims));
  if (ds.dims[0] == 0) fail_input("{}: {} has no tokens", path, name);
  return ds;
}

// Calls f(tokens, index of the first, count) over the whole dataset, a chunk at a time (as
// int64, whatever the stored type), so validating a large file needs little memory.
template <typename F>
void scan_tokens(const Dataset& ds, F&& f) {
  constexpr hsize_t kChunk = hsize_t(1) << 20;
  const hsize_t n = ds.dims[0];
  std::vector<int64_t> buf(size_t(std::min(kChunk, n)));
  H5Id file_space(H5_CHECK(H5Dget_space(ds.id.get())), H5Sclose);
  for (hsize_t at = 0; at < n; at += kChunk) {
    hsize_t count = std::min(kChunk, n - at);
    H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &at, nullptr, &count, nullptr));
    H5Id mem(H5_CHECK(H5Screate_simple(1, &count, nullptr)), H5Sclose);
    H5_CHECK(H5Dread(ds.id.get(), H5T_NATIVE_INT64, mem.get(), file_space.get(), H5P_DEFAULT,
                     buf.data()));
    f(buf.data(), int64_t(at), int64_t(count));
  }
}

int64_t max_token(const Dataset& ds) {
  int64_t top = std::numeric_limits<int64_t>::min();
  scan_tokens(ds, [&](const int64_t* t, int64_t, int64_t count) {
    top = std::max(top, *std::max_element(t, t + count));
  });
  return top;
}

void check_tokens(const std::string& path, const Dataset& ds, int64_t vocab) {
  scan_tokens(ds, [&](const int64_t* t, int64_t first, int64_t count) {
    for (int64_t i = 0; i < count; ++i)
      if (t[i] < 0 || t[i] >= vocab)
        fail_input("{}: {}[{}] = {} is out of range [0, {})", path, ds.name, first + i, t[i],
                   vocab);
  });
}

// A scalar attribute on the root group, checked for its type class; nullopt if absent.
std::optional<H5Id> open_root_attr(const std::string& path, hid_t file, const char* name,
                                   H5T_class_t want, const char* want_name) {
  if (H5_CHECK(H5Aexists(file, name)) <= 0) return std::nullopt;
  H5Id attr(H5_CHECK(H5Aopen(file, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  H5Id space(H5_CHECK(H5Aget_space(attr.get())), H5Sclose);
  if (H5Tget_class(type.get()) != want)
    fail_input("{}: root attribute {} has dtype {}; expected {}", path, name,
               dtype_name(type.get()), want_name);
  if (H5_CHECK(H5Sget_simple_extent_npoints(space.get())) != 1)
    fail_input("{}: root attribute {} must hold a single value", path, name);
  return attr;
}

std::optional<int64_t> read_int_attr(const std::string& path, hid_t file, const char* name) {
  auto attr = open_root_attr(path, file, name, H5T_INTEGER, "an integer");
  if (!attr) return std::nullopt;
  int64_t v = 0;
  H5_CHECK(H5Aread(attr->get(), H5T_NATIVE_INT64, &v));
  return v;
}

std::optional<double> read_double_attr(const std::string& path, hid_t file, const char* name) {
  auto attr = open_root_attr(path, file, name, H5T_FLOAT, "a float");
  if (!attr) return std::nullopt;
  double v = 0;
  H5_CHECK(H5Aread(attr->get(), H5T_NATIVE_DOUBLE, &v));
  return v;
}

// Accepts both fixed-length strings and variable-length ones (what h5py writes for a str).
std::optional<std::string> read_string_attr(const std::string& path, hid_t file,
                                            const char* name) {
  auto attr = open_root_attr(path, file, name, H5T_STRING, "a string");
  if (!attr) return std::nullopt;
  H5Id ftype(H5_CHECK(H5Aget_type(attr->get())), H5Tclose);
  H5Id mtype(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_cset(mtype.get(), H5_CHECK(H5Tget_cset(ftype.get()))));
  if (H5_CHECK(H5Tis_variable_str(ftype.get())) > 0) {
    H5_CHECK(H5Tset_size(mtype.get(), H5T_VARIABLE));
    char* p = nullptr;
    H5_CHECK(H5Aread(attr->get(), mtype.get(), &p));
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(ftype.get());
  std::string buf(size, '\0');
  H5_CHECK(H5Tset_size(mtype.get(), size));
  H5_CHECK(H5Tset_strpad(mtype.get(), H5T_STR_NULLPAD));
  H5_CHECK(H5Aread(attr->get(), mtype.get(), buf.data()));
  return buf.substr(0, buf.find('\0'));
}

// A token file says so (kind = "tokens") or has /train/tokens.
bool is_token_file(const std::string& path, hid_t file) {
  if (auto kind = read_string_attr(path, file, "kind")) {
    if (*kind != "tokens")
      fail_input("{}: root attribute kind = \"{}\"; expected \"tokens\" (or no kind, for images)",
                 path, *kind);
    return true;
  }
  return link_exists(file, "/train/tokens");
}

DatasetInfo inspect_token_file(const std::string& path, hid_t file) {
  DatasetInfo info;
  info.path = path;
  info.tokens = true;
  Dataset train = open_tokens(path, file, "/train/tokens");
  info.train.name = "train";
  info.train.dataset = train.name;
  info.train.tokens = int64_t(train.dims[0]);
  Dataset val;
  info.has_test = link_exists(file, "/val/tokens");
  if (info.has_test) {
    val = open_tokens(path, file, "/val/tokens");
    info.test.name = "test";
    info.test.dataset = val.name;
    info.test.tokens = int64_t(val.dims[0]);
  }
  int64_t vocab = 0;
  if (auto v = read_int_attr(path, file, "vocab")) {
    if (*v < 1 || *v > kMaxVocab)
      fail_input("{}: root attribute vocab = {}; expected a vocabulary size in [1, 2^24] (batches "
                 "carry token ids as float32, exact up to 2^24)",
                 path, *v);
    vocab = *v;
  } else {
    vocab = std::clamp<int64_t>(max_token(train) + 1, 1, kMaxVocab);
  }
  check_tokens(path, train, vocab);
  if (info.has_test) check_tokens(path, val, vocab);
  info.vocab = int(vocab);
  info.classes = info.vocab;
  if (auto h = read_double_attr(path, file, "unigram_entropy_nats")) {
    if (!std::isfinite(*h) || *h < 0)
      fail_input("{}: root attribute unigram_entropy_nats = {}; expected a finite value >= 0",
                 path, *h);
    info.unigram_entropy_nats = *h;
  }
  if (auto sha = read_string_attr(path, file, "source_sha256")) info.source_sha256 = *sha;
  return info;
}

DatasetInfo inspect_file(const std::string& path) {
  H5Id file = open_h5(path);
  if (is_token_file(path, file.get())) return inspect_token_file(path, file.get());
  DatasetInfo info;
  info.path = path;
  Split train = read_split(path, file.get(), "train");
  info.train = train.info;
  Split test;
  info.has_test = link_exists(file.get(), "/test");
  if (info.has_test) {
    test = read_split(path, file.get(), "test");
    info.test = test.info;
    if (test.info.sample_shape != train.info.sample_shape)
      fail_input("{}: /test/images has sample shape {} but /train/images has {}", path,
                 shape_str(test.info.sample_shape), shape_str(train.info.sample_shape));
  }
  if (auto classes = read_int_attr(path, file.get(), "classes")) {
    if (*classes < 1 || *classes > kMaxVocab)
      fail_input("{}: root attribute classes = {}; expected a class count in [1, 2^24] (labels "
                 "travel as float32, exact up to 2^24)", path, *classes);
    info.classes = int(*classes);
  } else {
    int64_t top = *std::max_element(train.labels.begin(), train.labels.end());
    info.classes = int(std::clamp<int64_t>(top + 1, 0, kMaxVocab));
  }
  check_labels(path, "train", train.labels, info.classes);
  if (info.has_test) check_labels(path, "test", test.labels, info.classes);
  if (auto sha = read_string_attr(path, file.get(), "source_sha256")) info.source_sha256 = *sha;
  return info;
}

}  // namespace

DatasetInfo open_dataset(const std::string& path) {
  std::lock_guard lock(hdf5_mutex());
  struct stat sb{};
  ReadDeadline deadline(path, ::stat(path.c_str(), &sb) == 0 ? int64_t(sb.st_size) : 0,
                        kExitBadInput, /*quarantine=*/false);
  h5_quiet();
  return with_file_context(path, [&] { return inspect_file(path); });
}

void set_context(DatasetInfo& info, int64_t context) {
  if (!info.tokens)
    fail_input("{}: holds images, not tokens; model.context applies to token data", info.path);
  if (context < 1) fail_input("model.context = {}: expected a positive number of tokens", context);
  for (SplitInfo* s : {&info.train, info.has_test ? &info.test : nullptr}) {
    if (!s) continue;
    if (s->tokens - 1 < context)
      fail_input("{}: {} has {} tokens; model.context = {} needs at least {} (one window of "
                 "context + 1 tokens)",
                 info.path, s->dataset, s->tokens, context, context + 1);
    s->n = (s->tokens - 1) / context;
    s->sample_shape = {context};
  }
  info.context = context;
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(size_t(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), int64_t(0));
  Rng rng(hash_combine(seed, uint64_t(epoch)));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i) + 1)]);
  return order;
}

// ---------------------------------------------------------------- Loader

// Two modes. In memory (the split fits the cache budget): no thread; next() gathers the batch
// (req_epoch, req_index) from all_rows into slots[0] itself. Streaming, with a reader thread:
// the consumer owns slots[front]; the reader thread fills slots[front ^ 1] with the
// batch requested by (req_epoch, req_index). Each request has a generation number; the reader
// publishes done_gen when it finishes one, so a seek() while a read is in flight just bumps the
// generation and the stale result is discarded.
struct Loader::Impl {
  // Fixed after construction.
  std::string path, split;
  int64_t n = 0, global_batch = 0, batches = 0;
  int rank = 0, ranks = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  Shape sample_shape;
  int64_t sample_elems = 0;
  bool u8 = true;
  std::vector<int32_t> labels;
  H5Id file, images, file_space;  // used under hdf5_mutex(), by the reader thread only
  std::vector<hsize_t> dims;      // of the images dataset (token files: of the tokens)
  std::string where;              // the split in messages: "/train", or "/val/tokens"

  // Token files: "row" i is the window tokens[i*T, i*T + T + 1), so consecutive rows share
  // one token. Stored at their own width (token_bytes) in all_rows and staging.
  bool tokens = false;
  int64_t T = 0, n_tokens = 0, vocab = 0;
  size_t token_bytes = 0;  // 1, 2, 4: uint8, uint16, int32

  // Reader-thread scratch.
  int64_t order_epoch = -1;
  std::vector<int64_t> order, ids;
  std::vector<std::pair<int64_t, int64_t>> sorted;  // (row in file, position in batch)
  std::vector<std::pair<hsize_t, hsize_t>> runs;    // (first row, rows) of consecutive rows
  std::vector<unsigned char> staging;

  // In-memory mode: the whole split's images as stored (uint8 or float32), read once at
  // construction. Then next() gathers its rows from here on the calling thread, and there is
  // no reader thread and no HDF5 call after the constructor.
  bool in_memory = false;
  std::vector<unsigned char> all_rows;

  // Shared, under m.
  std::mutex m;
  std::condition_variable cv;
  Batch slots[2];
  int front = 0;
  int64_t req_epoch = 0, req_index = 0;
  uint64_t req_gen = 1, done_gen = 0;
  std::exception_ptr error;
  bool stop = false;
  std::thread reader;

  struct Slice {
    int64_t begin, count, first;  // positions in the epoch order; offset within the batch
  };
  Slice slice(int64_t index) const {
    int64_t start = index * global_batch;
    int64_t g = shuffle ? global_batch : std::min(global_batch, n - start);
    int64_t lo = rank * g / ranks, hi = (rank + 1) * g / ranks;
    return {start + lo, hi - lo, lo};
  }

  void open(const DatasetInfo& info, const SplitInfo& want) {
    file = open_h5(path);
    if (tokens) {
      Dataset ds = open_tokens(path, file.get(), want.dataset);
      if (int64_t(ds.dims[0]) != want.tokens)
        fail_input("{}: {} changed since it was opened", path, want.dataset);
      token_bytes = H5Tget_size(ds.type.get());
      images = std::move(ds.id);
      dims = ds.dims;
      file_space = H5Id(H5_CHECK(H5Dget_space(images.get())), H5Sclose);
      return;
    }
    Split s = read_split(path, file.get(), split);
    if (s.info.n != want.n || s.info.sample_shape != want.sample_shape ||
        s.info.images_u8 != want.images_u8)
      fail_input("{}: /{} changed since it was opened", path, split);
    check_labels(path, split, s.labels, info.classes);
    labels.assign(s.labels.begin(), s.labels.end());
    images = std::move(s.images.id);
    dims = s.images.dims;
    file_space = H5Id(H5_CHECK(H5Dget_space(images.get())), H5Sclose);
  }

  void close() {
    std::lock_guard lock(hdf5_mutex());
    file_space.reset();
    images.reset();
    file.reset();
  }

  // The rows in `sorted` as a union of hyperslabs, one per run of consecutive rows, so HDF5 reads
  // each run with one request. HDF5 1.10 makes each OR cost time proportional to the selection
  // so far, so adding runs one by one is quadratic (17 ms for 1024 rows); OR-ing halves
  // recursively with H5Scombine_select stays near-linear (0.8 ms).
  H5Id select_runs(size_t lo, size_t hi) const {
    if (hi - lo <= 8) {
      H5Id space(H5_CHECK(H5Scopy(file_space.get())), H5Sclose);
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      for (size_t i = lo; i < hi; ++i) {
        start[0] = tokens ? runs[i].first * T : runs[i].first;
        count[0] = tokens ? runs[i].second * T + 1 : runs[i].second;
        H5_CHECK(H5Sselect_hyperslab(space.get(), i == lo ? H5S_SELECT_SET : H5S_SELECT_OR,
                                     start.data(), nullptr, count.data(), nullptr));
      }
      return space;
    }
    size_t mid = lo + (hi - lo) / 2;
    H5Id a = select_runs(lo, mid), b = select_runs(mid, hi);
    return H5Id(H5_CHECK(H5Scombine_select(a.get(), H5S_SELECT_OR, b.get())), H5Sclose);
  }

  // Reads rows ids[0..count) of the images into x (batch order), scaling uint8 by 1/255; or
  // for token files the windows ids[0..count) into x and y.
  void read_rows(float* x, int32_t* y) {
    int64_t count = int64_t(ids.size());
    if (count == 0) return;
    sorted.resize(count);
    for (int64_t k = 0; k < count; ++k) sorted[k] = {ids[k], k};
    std::sort(sorted.begin(), sorted.end());
    runs.clear();
    for (int64_t a = 0, b; a < count; a = b) {
      for (b = a + 1; b < count && sorted[b].first == sorted[b - 1].first + 1;) ++b;
      runs.push_back({hsize_t(sorted[a].first), hsize_t(b - a)});
    }
    // A run of token windows [a, a + k) is the k*T + 1 tokens from a*T; runs never touch
    // (a gap of at least one window lies between), so the union reads each token once.
    hsize_t total = 0;
    for (const auto& r : runs) total += tokens ? r.second * T + 1 : r.second * sample_elems;
    staging.resize(total * elem_bytes());
    {
      std::lock_guard lock(hdf5_mutex());
      H5Id rows = select_runs(0, runs.size());
      H5Id mem(H5_CHECK(H5Screate_simple(1, &total, nullptr)), H5Sclose);
      H5_CHECK(H5Dread(images.get(), mem_type(), mem.get(), rows.get(), H5P_DEFAULT,
                       staging.data()));
    }
    // staging holds the rows in file order; put each where the batch wants it.
    if (tokens) {
      size_t j = 0, at = 0;  // at: the run's first token in staging
      for (const auto& r : runs) {
        for (hsize_t q = 0; q < r.second; ++q, ++j)
          window_to_xy(staging.data() + (at + q * T) * token_bytes, sorted[j].first,
                       x + sorted[j].second * T, y + sorted[j].second * T);
        at += r.second * T + 1;
      }
      return;
    }
    const size_t rb = row_bytes();
    for (int64_t j = 0; j < count; ++j)
      convert_row(x + sorted[j].second * sample_elems, staging.data() + j * rb);
  }

  size_t elem_bytes() const { return tokens ? token_bytes : u8 ? 1 : sizeof(float); }
  hid_t mem_type() const {
    return tokens ? token_mem_type(token_bytes) : u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
  }
  // Bytes from one row's start to the next's in all_rows (a token window is one more).
  size_t row_bytes() const { return size_t(sample_elems) * elem_bytes(); }
  size_t row_span() const { return tokens ? (size_t(T) + 1) * token_bytes : row_bytes(); }
  double split_bytes() const {
    return double(tokens ? n_tokens : n) * double(tokens ? token_bytes : row_bytes());
  }

  // Token window `row` (its T + 1 tokens at w, stored width) -> x[0, T) the inputs as floats,
  // y[0, T) the next tokens. Checks the ids again: the file may have changed since it was
  // validated, and an id out of range would index past the embedding table.
  template <typename Tok>
  void window_as(const unsigned char* w, int64_t row, float* x, int32_t* y) const {
    auto id = [&](int64_t i) {
      Tok t;
      std::memcpy(&t, w + i * int64_t(sizeof(Tok)), sizeof(Tok));
      const int64_t v = int64_t(t);
      if (v < 0 || v >= vocab)
        fail_input("{}: {}[{}] = {} is out of range [0, {})", path, where, row * T + i, v, vocab);
      return v;
    };
    int64_t cur = id(0);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t next = id(i + 1);
      x[i] = float(cur);
      y[i] = int32_t(next);
      cur = next;
    }
  }
  void window_to_xy(const unsigned char* w, int64_t row, float* x, int32_t* y) const {
    if (token_bytes == 1) window_as<uint8_t>(w, row, x, y);
    else if (token_bytes == 2) window_as<uint16_t>(w, row, x, y);
    else window_as<int32_t>(w, row, x, y);
  }

  // One stored row -> floats (uint8 scaled by 1/255, float32 copied).
  void convert_row(float* dst, const unsigned char* src) const {
    if (u8) u8_to_unit_float(dst, src, sample_elems);
    else std::memcpy(dst, src, row_bytes());
  }

  // Reads the whole images (or tokens) dataset into all_rows (the constructor, under
  // hdf5_mutex()).
  void load_all() {
    all_rows.resize(size_t(split_bytes()));
    H5_CHECK(H5Dread(images.get(), mem_type(), H5S_ALL, H5S_ALL, H5P_DEFAULT, all_rows.data()));
  }

  // Asks the CPU to fetch the rows of batch (epoch, index) from memory into cache, so the
  // gather in the next call to next() finds them there instead of waiting for DRAM (the rows
  // of a shuffled batch are scattered over the whole split). Only within the current epoch.
  void prefetch(int64_t epoch, int64_t index) const {
    if (shuffle && order_epoch != epoch) return;
    const Slice sl = slice(index);
    const size_t rb = row_bytes(), span = row_span();
    for (int64_t k = 0; k < sl.count; ++k) {
      const int64_t row = shuffle ? order[size_t(sl.begin + k)] : sl.begin + k;
      const unsigned char* r = all_rows.data() + size_t(row) * rb;
      for (size_t off = 0; off < span; off += 64) __builtin_prefetch(r + off, 0, 2);
    }
  }

  // Rows ids[0..count) from memory into x (token files: and y), in batch order.
  void gather_rows(float* x, int32_t* y) const {
    const size_t rb = row_bytes();
    for (size_t k = 0; k < ids.size(); ++k) {
      const unsigned char* row = all_rows.data() + size_t(ids[k]) * rb;
      if (tokens) window_to_xy(row, ids[k], x + int64_t(k) * T, y + int64_t(k) * T);
      else convert_row(x + int64_t(k) * sample_elems, row);
    }
  }

  void fill(Batch& b, int64_t epoch, int64_t index) {
    Slice s = slice(index);
    ids.resize(s.count);
    if (shuffle) {
      if (order_epoch != epoch) {
        order = epoch_order(n, seed, epoch);
        order_epoch = epoch;
      }
      std::copy_n(order.begin() + s.begin, s.count, ids.begin());
    } else {
      std::iota(ids.begin(), ids.end(), s.begin);
    }
    b.epoch = epoch;
    b.index = index;
    b.first_sample = s.first;
    b.x.resize(batched(s.count, sample_shape));
    if (tokens) {
      b.y.resize(size_t(s.count * T));  // filled with x from the windows
    } else {
      b.y.resize(s.count);
      for (int64_t k = 0; k < s.count; ++k) b.y[k] = labels[ids[k]];
    }
    if (in_memory) gather_rows(b.x.data(), b.y.data());
    else with_file_context(path, [&] { read_rows(b.x.data(), b.y.data()); });
  }

  void run() {
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return stop || done_gen != req_gen; });
      if (stop) return;
      uint64_t gen = req_gen;
      int64_t epoch = req_epoch, index = req_index;
      Batch& dst = slots[front ^ 1];
      lk.unlock();
      std::exception_ptr err;
      try {
        fill(dst, epoch, index);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      done_gen = gen;
      error = gen == req_gen ? err : nullptr;
      cv.notify_all();
    }
  }
};

Loader::Loader(const DatasetInfo& info, const std::string& split, int64_t global_batch, int rank,
               int ranks, bool shuffle, uint64_t seed)
    : impl_(nullptr) {
  STRATA_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of {}", rank, ranks);
  STRATA_CHECK(!info.tokens || info.context > 0,
               "{}: a token file needs set_context before a Loader reads it", info.path);
  const SplitInfo* s = split == "train"                  ? &info.train
                       : split == "test" && info.has_test ? &info.test
                                                          : nullptr;
  const std::string where = !info.tokens ? "/" + split
                            : s          ? s->dataset
                            : split == "test" ? std::string("/val/tokens")
                                              : "/" + split + "/tokens";
  if (!s) fail_input("{}: has no {} split", info.path, where);
  if (global_batch < ranks)
    fail_input("global batch {} is smaller than the {} ranks; every rank needs a sample",
               global_batch, ranks);
  if (shuffle && global_batch > s->n)
    fail_input("{}: global batch {} exceeds the {} samples of {}{}", info.path, global_batch,
               s->n, where,
               info.tokens ? fmt::format(" (windows of model.context = {} tokens)", info.context)
                           : "");
  auto p = std::make_unique<Impl>();
  p->path = info.path;
  p->split = split;
  p->where = where;
  p->tokens = info.tokens;
  p->T = info.context;
  p->n_tokens = s->tokens;
  p->vocab = info.vocab;
  p->n = s->n;
  p->global_batch = global_batch;
  p->batches = shuffle ? s->n / global_batch : (s->n + global_batch - 1) / global_batch;
  p->rank = rank;
  p->ranks = ranks;
  p->shuffle = shuffle;
  p->seed = seed;
  p->sample_shape = s->sample_shape;
  p->sample_elems = numel(s->sample_shape);
  p->u8 = s->images_u8;
  const int64_t budget = cache_budget_bytes();
  try {
    {
      // Opened here, before the reader starts; from then on only the reader uses these ids.
      std::lock_guard lock(hdf5_mutex());
      h5_quiet();
      with_file_context(info.path, [&] { p->open(info, *s); });
      // A split that fits the budget is read once, whole: each batch is then a gather from
      // memory on the caller's thread (a few microseconds for 64 Fashion-MNIST rows, where a
      // hyperslab read of 64 scattered rows costs a reader thread 0.1-0.2 ms of the other
      // core). Which rows a rank uses is unchanged. If that read fails, the loader streams
      // instead, so a damaged file reports its error at the batch that needs the bad rows.
      if (p->split_bytes() <= double(budget)) {
        try {
          p->load_all();
          p->in_memory = true;
          p->file_space.reset();
          p->images.reset();
          p->file.reset();
        } catch (const std::runtime_error&) {
          std::vector<unsigned char>().swap(p->all_rows);
        }
      }
    }
    if (!p->in_memory) {
      Impl* impl = p.get();
      p->reader = std::thread([impl] { impl->run(); });
    }
  } catch (...) {
    p->close();
    throw;
  }
  impl_ = p.release();
}

Loader::~Loader() {
  {
    std::lock_guard lk(impl_->m);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->reader.joinable()) impl_->reader.join();
  impl_->close();
  delete impl_;
}

int64_t Loader::batches_per_epoch() const { return impl_->batches; }

void Loader::seek(int64_t epoch, int64_t batch) {
  Impl& m = *impl_;
  if (epoch < 0 || batch < 0 || batch >= m.batches)
    fail_input("{}: cannot seek to batch {} of epoch {}: {} has {} batches per epoch at global "
               "batch {}",
               m.path, batch, epoch, m.where, m.batches, m.global_batch);
  std::lock_guard lk(m.m);
  m.req_epoch = epoch;
  m.req_index = batch;
  ++m.req_gen;
  m.error = nullptr;
  m.cv.notify_all();
}

const Loader::Batch& Loader::next() {
  Impl& m = *impl_;
  if (m.in_memory) {  // no reader thread: gather the requested batch here
    m.fill(m.slots[0], m.req_epoch, m.req_index);
    const bool last = m.req_index + 1 == m.batches;
    m.req_epoch += last ? 1 : 0;
    m.req_index = last ? 0 : m.req_index + 1;
    m.prefetch(m.req_epoch, m.req_index);
    return m.slots[0];
  }
  std::unique_lock lk(m.m);
  m.cv.wait(lk, [&] { return m.done_gen == m.req_gen; });
  if (m.error) {
    // Ask for the same batch again, so a later call retries rather than skipping it.
    std::exception_ptr err = std::exchange(m.error, nullptr);
    ++m.req_gen;
    m.cv.notify_all();
    std::rethrow_exception(err);
  }
  m.front ^= 1;
  bool last = m.req_index + 1 == m.batches;
  m.req_epoch += last ? 1 : 0;
  m.req_index = last ? 0 : m.req_index + 1;
  ++m.req_gen;
  m.cv.notify_all();
  return m.slots[m.front];
}

}  // namespace strata
