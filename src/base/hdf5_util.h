// HDF5 plumbing shared by the data, prepare and checkpoint code (internal header).
// This HDF5 build is not thread-safe: hold hdf5_mutex() (data.h) around every call.
#pragma once
#include <hdf5.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace strata {

// HDF5 prints its error stack to stderr by default; strata reports errors itself.
inline void h5_quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// The innermost (most specific) message on HDF5's error stack, "" if there is none.
inline std::string h5_error_detail() {
  std::string detail;
  auto visit = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    if (e->desc && *e->desc) *static_cast<std::string*>(out) = e->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, visit, &detail);
  return detail;
}

// Every HDF5 call goes through H5_CHECK: a negative return becomes an error naming the call and
// the source line. Failures a user can cause are checked before the call and reported with
// fail_input, so reaching this means a damaged file, an I/O error or a bug.
template <typename T>
T h5_check(T ret, const char* call, const char* src, int line) {
  if (ret >= 0) return ret;
  std::string_view name(call);
  name = name.substr(0, name.find('('));
  std::string detail = h5_error_detail();
  throw std::runtime_error(fmt::format("HDF5 call {} failed ({}:{}){}{}", name,
                                       std::filesystem::path(src).filename().string(), line,
                                       detail.empty() ? "" : ": ", detail));
}
#define H5_CHECK(call) ::strata::h5_check((call), #call, __FILE__, __LINE__)

// Owns an HDF5 identifier (file, dataset, dataspace, ...) and closes it once.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer close) : id_(id), close_(close) {}
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  ~H5Id() { reset(); }
  void reset() {
    if (id_ >= 0) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

inline void write_int_attr(hid_t obj, const char* name, const std::vector<int64_t>& v) {
  hsize_t n = v.size();
  H5Id space(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, v.data()));
}
inline void write_int_attr(hid_t obj, const char* name, int64_t value) {
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
}

// Variable-length UTF-8: what h5py writes for a Python str, and reads back as one.
inline void write_str_attr(hid_t obj, const std::string& name, const std::string& value) {
  H5Id type(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  H5Id space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  const char* p = value.c_str();
  H5_CHECK(H5Awrite(attr.get(), type.get(), &p));
}

// Reads a string attribute, fixed-length or variable-length; false if absent or not a string.
inline bool read_str_attr(hid_t obj, const char* name, std::string* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  H5Id attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5Id type(H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return false;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    H5_CHECK(H5Tset_size(mem.get(), H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())));  // no ASCII<->UTF-8 conversion
    char* p = nullptr;
    H5_CHECK(H5Aread(attr.get(), mem.get(), &p));
    *out = p ? p : "";
    H5free_memory(p);
    return true;
  }
  std::vector<char> buf(H5Tget_size(type.get()) + 1, 0);
  H5Id mem(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(mem.get(), buf.size()));
  H5_CHECK(H5Tset_cset(mem.get(), H5Tget_cset(type.get())));
  H5_CHECK(H5Aread(attr.get(), mem.get(), buf.data()));
  *out = buf.data();
  return true;
}

// Reads an integer attribute (scalar or 1-D); false if absent.
inline bool read_int_attr(hid_t obj, const char* name, std::vector<int64_t>* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  H5Id attr(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5Id space(H5_CHECK(H5Aget_space(attr.get())), H5Sclose);
  out->assign(size_t(std::max<hssize_t>(H5Sget_simple_extent_npoints(space.get()), 0)), 0);
  return H5Aread(attr.get(), H5T_NATIVE_INT64, out->data()) >= 0;
}

}  // namespace strata
