// Data and token files: opening, validating and describing them (data.h).
#include "data/data.h"

#include <hdf5.h>
#include <sys/stat.h>

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

#include "base/memory.h"
#include "base/parse.h"
#include "base/read_guard.h"
#include "data/h5_datasets.h"
#include "data/token_shards.h"
#include "data/tokenizer_identity.h"
#include "strata/error.h"

namespace strata {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}
namespace {

// ---------------------------------------------------------------- HDF5 plumbing


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
  info.format = "hdf5";
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
  info.tokenizer = read_tokenizer_attrs(file);
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

void check_labels(const std::string& path, const std::string& split,
                  const std::vector<int64_t>& labels, int64_t classes) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      fail_input("{}: /{}/labels[{}] = {} is out of range [0, {})", path, split, i, labels[i],
                 classes);
}

DatasetInfo open_dataset(const std::string& path, const DataOptions& options) {
  const std::vector<std::string> files = data_files(path, "data.path");
  const std::string format = data_format(files, options.format, "data.path");
  if (format != "hdf5") return open_token_shards(path, format, options);
  if (files.size() != 1)
    fail_input("data.path names {} HDF5 files ({}, ...); an HDF5 data file is read alone",
               files.size(), files[0]);
  if (!options.val_path.empty())
    fail_input("data.val_path = '{}': applies to token shards; {} is HDF5, and holds its "
               "validation split itself (/val/tokens, /test)", options.val_path, files[0]);
  return open_hdf5_dataset(files[0]);
}

DatasetInfo open_hdf5_dataset(const std::string& path) {
  std::lock_guard lock(hdf5_mutex());
  struct stat sb{};
  ReadGuard guard(path, ::stat(path.c_str(), &sb) == 0 ? int64_t(sb.st_size) : 0,
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

}  // namespace strata
