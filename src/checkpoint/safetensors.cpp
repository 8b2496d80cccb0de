#include "checkpoint/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "base/files.h"
#include "base/json.h"
#include "base/metrics.h"
#include "strata/error.h"

namespace strata {
namespace {

constexpr uint64_t kMaxHeader = 100000000;  // the reference implementation's limit

[[noreturn]] void bad(const std::string& msg) { throw UserError(kExitBadCheckpoint, msg); }

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + size_t(n) >= s.size()) return false;
    for (int k = 1; k <= n; ++k)
      if ((static_cast<unsigned char>(s[i + size_t(k)]) >> 6) != 2) return false;
    i += size_t(n) + 1;
  }
  return true;
}

std::string read_range(std::ifstream& in, int64_t at, int64_t n) {
  std::string s(size_t(n), '\0');
  in.seekg(at);
  if (!in.read(s.data(), n)) throw std::runtime_error("short read");
  return s;
}

// One header entry: its dtype, shape and offsets, checked on their own.
struct Entry {
  std::string name, dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};
Entry parse_entry(const std::string& name, const JsonValue& v, const std::string& where) {
  Entry e;
  e.name = name;
  const JsonValue* dt = v.is_object() ? v.find("dtype") : nullptr;
  const JsonValue* sh = v.is_object() ? v.find("shape") : nullptr;
  const JsonValue* off = v.is_object() ? v.find("data_offsets") : nullptr;
  if (!dt || !sh || !off || !dt->is_string() || !sh->is_array() || !off->is_array())
    bad(fmt::format("{}: header entry \"{}\" needs \"dtype\" (a string), \"shape\" and "
                    "\"data_offsets\" (arrays)", where, name));
  e.dtype = dt->text;
  if (safetensors_dtype_size(e.dtype) == 0)
    bad(fmt::format("{}: tensor {} has an unknown dtype \"{}\"", where, name, e.dtype));
  for (const JsonValue& d : sh->items) {
    if (!d.is_int() || d.int_value < 0 || d.int_value > (int64_t(1) << 40))
      bad(fmt::format("{}: tensor {}: shape entries must be non-negative integers", where, name));
    e.shape.push_back(d.int_value);
  }
  if (off->items.size() != 2 || !off->items[0].is_int() || !off->items[1].is_int() ||
      off->items[0].int_value < 0 || off->items[1].int_value < off->items[0].int_value)
    bad(fmt::format("{}: tensor {}: data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END",
                    where, name));
  e.begin = uint64_t(off->items[0].int_value);
  e.end = uint64_t(off->items[1].int_value);
  // numel fits: each dimension is at most 2^40, and the product is checked against the buffer.
  long double n = 1;
  for (int64_t d : e.shape) n *= static_cast<long double>(d);
  const long double bytes = n * static_cast<long double>(safetensors_dtype_size(e.dtype));
  if (bytes != static_cast<long double>(e.end - e.begin))
    bad(fmt::format("{}: tensor {}: data_offsets [{}, {}] hold {} bytes; dtype {} and shape {} "
                    "need {:.0f}", where, name, e.begin, e.end, e.end - e.begin, e.dtype,
                    shape_str(e.shape), static_cast<double>(bytes)));
  return e;
}

}  // namespace

int64_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64" || d == "C64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "U8" || d == "I8" || d == "BOOL" || d == "F8_E5M2" || d == "F8_E4M3" ||
      d == "F8_E8M0" || d == "F8_E4M3FNUZ" || d == "F8_E5M2FNUZ")
    return 1;
  return 0;
}

uint16_t bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

std::string encode_floats(const float* p, int64_t n, const std::string& dtype) {
  std::string out;
  if (dtype == "F32") {
    out.resize(size_t(n) * 4);
    std::memcpy(out.data(), p, size_t(n) * 4);  // x86-64 and aarch64 Linux: little-endian
  } else {
    STRATA_CHECK(dtype == "BF16", "encode_floats: dtype {}", dtype);
    out.resize(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = bf16_round(p[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

std::vector<float> decode_floats(const std::string& bytes, const std::string& dtype,
                                 const std::string& where) {
  std::vector<float> v;
  if (dtype == "F32") {
    v.resize(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    v.resize(bytes.size() / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      uint32_t u = uint32_t(h) << 16;
      if (dtype == "F16") {  // sign, 5-bit exponent, 10-bit fraction, widened exactly
        const uint32_t sign = uint32_t(h & 0x8000u) << 16, ex = (h >> 10) & 0x1Fu, fr = h & 0x3FFu;
        if (ex == 0x1F) {
          u = sign | 0x7F800000u | (fr << 13);
        } else if (ex != 0) {
          u = sign | ((ex + 112) << 23) | (fr << 13);
        } else {  // zero or subnormal: fr x 2^-24
          const float f = float(fr) * 5.9604644775390625e-8f;
          std::memcpy(&u, &f, 4);
          u |= sign;
        }
      }
      std::memcpy(&v[i], &u, 4);
    }
  } else {
    bad(fmt::format("{}: dtype {} is not a floating-point type strata reads (F32, BF16, F16)",
                    where, dtype));
  }
  return v;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    header += fmt::format("{}{}:{}", first ? "" : ",", json_string(k), json_string(v));
    first = false;
  }
  header += "}";
  uint64_t at = 0;
  for (const SafeTensor& t : tensors) {
    std::string dims;
    for (size_t i = 0; i < t.shape.size(); ++i) dims += fmt::format("{}{}", i ? "," : "", t.shape[i]);
    header += fmt::format(",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          json_string(t.name), t.dtype, dims, at, at + t.bytes.size());
    at += t.bytes.size();
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail_input("{}: cannot create the file (is its directory writable?)", path);
    const uint64_t n = header.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xFF);
    out.write(len, 8);
    out.write(header.data(), std::streamsize(header.size()));
    for (const SafeTensor& t : tensors) out.write(t.bytes.data(), std::streamsize(t.bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail_input("{}: writing failed (disk full?); nothing was left under that name", path);
    }
  }
  publish_file(tmp, path);
}

SafeTensorsFile read_safetensors(const std::string& path) {
  struct stat sb{};
  if (::stat(path.c_str(), &sb) != 0) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) fail_input("{}: cannot open (not a regular file)", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  const uint64_t size = uint64_t(sb.st_size);
  SafeTensorsFile out;
  try {
    if (size < 8) bad(fmt::format("{}: {} bytes: too short for a safetensors header", path, size));
    const std::string len = read_range(in, 0, 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(len[size_t(i)]);
    if (n > kMaxHeader || n > size - 8)
      bad(fmt::format("{}: header length {} (the first 8 bytes) runs past the end of the file "
                      "({} bytes){}", path, n, size, n > kMaxHeader ? " or over 100 MB" : ""));
    const std::string header = read_range(in, 8, int64_t(n));
    if (n == 0 || header[0] != '{')
      bad(fmt::format("{}: the header does not begin with '{{' (byte 8)", path));
    if (!valid_utf8(header)) bad(fmt::format("{}: the header is not UTF-8", path));
    JsonValue h;
    try {
      h = parse_json(header, path + ": header");
    } catch (const UserError& e) {
      bad(e.what());
    }
    if (!h.is_object()) bad(fmt::format("{}: the header is not a JSON object", path));
    std::vector<Entry> entries;
    for (const auto& [name, v] : h.members) {
      if (name != "__metadata__") {
        entries.push_back(parse_entry(name, v, path));
        continue;
      }
      if (!v.is_object()) bad(fmt::format("{}: __metadata__ is not an object", path));
      for (const auto& [k, s] : v.members) {
        if (!s.is_string())
          bad(fmt::format("{}: __metadata__ value \"{}\" is not a string", path, k));
        out.metadata[k] = s.text;
      }
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    for (const Entry& e : entries) {
      if (e.begin != at)
        bad(fmt::format("{}: tensor {} starts at buffer offset {}, where {} (the buffer must be "
                        "covered in order, without gaps or overlaps)", path, e.name, e.begin,
                        e.begin < at ? fmt::format("the previous tensor ends at {}", at)
                                     : fmt::format("a gap follows byte {}", at)));
      at = e.end;
    }
    if (at != size - 8 - n)
      bad(fmt::format("{}: the tensors cover {} bytes of the buffer, which holds {} (offsets out "
                      "of range or bytes not indexed)", path, at, size - 8 - n));
    for (const Entry& e : entries)
      out.tensors.push_back({.name = e.name, .dtype = e.dtype, .shape = e.shape,
                             .bytes = read_range(in, int64_t(8 + n + e.begin), int64_t(e.end - e.begin))});
  } catch (const UserError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    bad(fmt::format("{}: cannot read it ({})", path, e.what()));
  }
  return out;
}

}  // namespace strata
