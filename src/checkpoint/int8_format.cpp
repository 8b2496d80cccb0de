// int8 files (strata quantize): a parameter file whose quantized linear weights are int8.
// Layout (docs/precision.md, "int8 inference"): the root attributes of a parameter file with format
// "strata-int8" and `int8_products` ("name<TAB>source" per line); /params/... the fp32 tensors
// except the weights replaced by int8 (a product whose name is its source); per product P
// (its global name's path, e.g. /int8/fc1/weight):
//   P/q          int8 (rows, cols), symmetric per row (output channel); attribute crc32 of
//                its bytes and `source`, the fp32 parameter it was made from
//   P/scale      float32 (rows): q * scale approximates the weight
//   P/act_scale  float32 (1): the calibrated activation scale, 0 for per-row at run time
// Every dataset carries its CRC-32; the file is written under a temporary name and renamed.
#include <zlib.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "checkpoint_write.h"
#include "strata/error.h"

namespace strata {
namespace {

[[noreturn]] void fail_checkpoint(const std::string& msg) {
  throw UserError(kExitBadCheckpoint, msg);
}

// zlib's CRC-32 of n bytes, fed in slices (one call takes at most UINT_MAX bytes).
uint32_t crc32_bytes(const int8_t* p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t at = 0; at < n;) {
    const uInt chunk = uInt(std::min<size_t>(n - at, size_t(1) << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p + at), chunk);
    at += chunk;
  }
  return uint32_t(crc);
}

// A scale strata can invert and multiply by: finite, and a normal positive float.
bool usable_scale(float s) { return std::isfinite(s) && s >= FLT_MIN; }

}  // namespace

std::string int8_path(const std::string& product) { return "/int8" + param_path(product).substr(7); }

std::vector<std::pair<std::string, std::string>> parse_int8_products(const std::string& text,
                                                                     const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t a = 0, b; a < text.size(); a = b + 1) {
    b = text.find('\n', a);
    if (b == std::string::npos) b = text.size();
    const std::string line = text.substr(a, b - a);
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || tab + 1 == line.size())
      fail_checkpoint(fmt::format("{}: root attribute int8_products: line '{}' is not "
                                  "'name<TAB>source'", path, line));
    out.emplace_back(line.substr(0, tab), line.substr(tab + 1));
  }
  return out;
}

void write_int8_products(hid_t f, const Int8Table& table) {
  std::string list;
  for (const auto& [name, w] : table.weights) list += name + "\t" + w.source + "\n";
  write_str_attr(f, "int8_products", list);
  const TensorPlists pl = tensor_plists();
  for (const auto& [name, w] : table.weights) {
    const hsize_t dims[2] = {hsize_t(w.rows), hsize_t(w.cols)};
    H5Id space(H5_CHECK(H5Screate_simple(2, dims, nullptr)), H5Sclose);
    H5Id d(H5_CHECK(H5Dcreate2(f, (int8_path(name) + "/q").c_str(), H5T_STD_I8LE, space.get(),
                               pl.link.get(), H5P_DEFAULT, H5P_DEFAULT)),
           H5Dclose);
    H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.q.data()));
    write_int_attr(d.get(), "crc32", int64_t(crc32_bytes(w.q.data(), w.q.size())));
    write_str_attr(d.get(), "source", w.source);
  }
}

std::vector<NamedTensor> int8_float_tensors(const Int8Table& table) {
  std::vector<NamedTensor> out;
  for (const auto& [name, w] : table.weights) {
    out.push_back({int8_path(name) + "/scale", {w.rows}, w.scale.data()});
    out.push_back({int8_path(name) + "/act_scale", {1}, &w.act_scale});
  }
  return out;
}

Shape int8_q_shape(hid_t f, const std::string& path, const std::string& product) {
  const std::string ds = int8_path(product) + "/q";
  if (H5Lexists(f, "/int8", H5P_DEFAULT) <= 0 || H5Oexists_by_name(f, ds.c_str(), H5P_DEFAULT) <= 0)
    fail_checkpoint(fmt::format("{}: int8 product {} has no dataset {}", path, product, ds));
  H5Id d(H5_CHECK(H5Dopen2(f, ds.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id space(H5_CHECK(H5Dget_space(d.get())), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(space.get()) != 2 ||
      H5Sget_simple_extent_dims(space.get(), dims, nullptr) != 2 || dims[0] < 1 || dims[1] < 1 ||
      dims[0] > INT32_MAX || dims[1] > INT32_MAX)
    fail_checkpoint(fmt::format("{}: {} is not a 2-D weight", path, ds));
  H5Id type(H5_CHECK(H5Dget_type(d.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 ||
      H5Tget_sign(type.get()) != H5T_SGN_2)
    fail_checkpoint(fmt::format("{}: {} is not int8", path, ds));
  // What strata writes: contiguous, every byte there. This bounds the memory a read asks for
  // by the file's size, before anything is allocated.
  if (int64_t(H5Dget_storage_size(d.get())) != int64_t(dims[0] * dims[1]))
    fail_checkpoint(fmt::format("{}: {} holds {} bytes of data; its shape needs {} (truncated or "
                                "not written by strata)", path, ds,
                                int64_t(H5Dget_storage_size(d.get())), int64_t(dims[0] * dims[1])));
  return {int64_t(dims[0]), int64_t(dims[1])};
}

void read_int8_products(hid_t f, const std::string& path, LoadedCheckpoint& out,
                        bool tolerate_mismatch) {
  for (auto& [name, w] : out.int8.weights) {
    const std::string ds = int8_path(name) + "/q";
    H5Id d(H5_CHECK(H5Dopen2(f, ds.c_str(), H5P_DEFAULT)), H5Dclose);
    w.q.resize(size_t(w.rows) * size_t(w.cols));
    if (H5Dread(d.get(), H5T_NATIVE_INT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.q.data()) < 0)
      fail_checkpoint(fmt::format("{}: cannot read {} (truncated or damaged)", path, ds));
    std::vector<int64_t> stored;
    const uint32_t crc = crc32_bytes(w.q.data(), w.q.size());
    if (!read_int_attr(d.get(), "crc32", &stored) || stored.size() != 1 ||
        uint32_t(stored[0]) != crc) {
      out.checksum[ds] = "MISMATCH";
      out.verified = false;
      if (!tolerate_mismatch)
        fail_checkpoint(fmt::format("{}: tensor {} fails its checksum", path, ds));
    } else {
      out.checksum[ds] = "ok";
    }
    w.scale = out.tensors.at(int8_path(name) + "/scale");
    w.act_scale = out.tensors.at(int8_path(name) + "/act_scale").at(0);
    if (!(w.act_scale == 0 || usable_scale(w.act_scale)))
      fail_checkpoint(fmt::format("{}: {}/act_scale = {} is not 0 or a positive normal number",
                                  path, int8_path(name), w.act_scale));
    for (float s : w.scale)
      if (!usable_scale(s))
        fail_checkpoint(fmt::format("{}: {}/scale holds {}, not a positive normal number", path,
                                    int8_path(name), s));
    w.col_sum.assign(size_t(w.rows), 0);
    for (int r = 0; r < w.rows; ++r) {
      int64_t sum = 0;  // |sum| <= 127 * cols: an int32 once cols fits the model's
      for (int c = 0; c < w.cols; ++c) sum += w.q[size_t(r) * w.cols + c];
      if (sum < INT32_MIN || sum > INT32_MAX)
        fail_checkpoint(fmt::format("{}: {} has rows too long for int32 sums", path, ds));
      w.col_sum[size_t(r)] = int32_t(sum);
    }
  }
}

}  // namespace strata
