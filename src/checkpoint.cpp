#include "strata/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "strata/data.h"
#include "strata/error.h"
#include "hdf5_util.h"

namespace strata {
namespace {

std::string join_lines(const ModelSpec& s) {
  std::string o;
  for (auto& l : s) o += l + "\n";
  return o;
}

void fsync_path(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) { ::fsync(fd); ::close(fd); }
}

std::string dir_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

}  // namespace

void save_parameters(const std::string& path, Model& model, const ParamFileMeta& meta) {
  std::lock_guard lock(hdf5_mutex());  // this HDF5 build is not thread-safe
  h5_quiet();
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    throw UserError(kExitBadInput, fmt::format("{}: cannot create the parameter file (is {} a "
                                               "writable directory?)", path, dir_of(path)));
  try {
    write_str_attr(f, "format", "strata-parameters");
    write_int_attr(f, "format_version", int64_t(1));
    write_str_attr(f, "strata_version", STRATA_VERSION);
    write_str_attr(f, "git_commit", STRATA_GIT_COMMIT);
    write_str_attr(f, "model_layers", join_lines(model.spec()));
    write_int_attr(f, "input_shape", model.input_shape());
    write_int_attr(f, "classes", int64_t(model.classes()));
    write_int_attr(f, "step", meta.step);
    write_str_attr(f, "config", meta.config_toml);
    write_str_attr(f, "dataset_sha256", meta.dataset_sha256);
    hid_t root = H5_CHECK(H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    for (auto& layer : model.layers()) {
      if (layer->params.empty()) continue;
      hid_t g = H5_CHECK(H5Gcreate2(root, layer->name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      for (auto& p : layer->params) {
        std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
        hid_t s = H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
        std::string leaf = p.name.substr(p.name.rfind('.') + 1);
        hid_t d = H5_CHECK(H5Dcreate2(g, leaf.c_str(), H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.value));
        H5Dclose(d); H5Sclose(s);
      }
      H5Gclose(g);
    }
    H5Gclose(root);
    H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));
    H5_CHECK(H5Fclose(f));
  } catch (...) {
    H5Fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UserError(kExitBadInput, fmt::format("{}: cannot rename {} into place: {}", path, tmp,
                                               std::strerror(errno)));
  }
  fsync_path(dir_of(path));
}

LoadedParams load_parameters(const std::string& path) {
  std::lock_guard lock(hdf5_mutex());
  h5_quiet();
  if (::access(path.c_str(), R_OK) != 0)
    fail_input("{}: cannot open parameter file ({})", path, std::strerror(errno));
  if (H5Fis_hdf5(path.c_str()) <= 0) fail_input("{}: not an HDF5 file", path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) fail_input("{}: cannot open as HDF5", path);
  LoadedParams out;
  try {
    std::string fmt_name, layers;
    if (!read_str_attr(f, "format", &fmt_name) || fmt_name != "strata-parameters")
      fail_input("{}: not a strata parameter file (root attribute 'format' is missing)", path);
    std::vector<int64_t> shape, classes;
    if (!read_str_attr(f, "model_layers", &layers) || !read_int_attr(f, "input_shape", &shape) ||
        !read_int_attr(f, "classes", &classes) || classes.size() != 1)
      fail_input("{}: missing model description attributes (model_layers, input_shape, classes)", path);
    read_str_attr(f, "config", &out.config_toml);
    for (size_t a = 0, b; a < layers.size(); a = b + 1) {
      b = layers.find('\n', a);
      if (b == std::string::npos) b = layers.size();
      if (b > a) out.spec.push_back(layers.substr(a, b - a));
    }
    out.input_shape = shape;
    out.classes = int(classes[0]);
    Model m(out.spec, out.input_shape, out.classes);  // validates the spec, names the params
    for (auto* p : m.params()) {
      std::string ds = "/params/" + p->name;
      std::replace(ds.begin() + 8, ds.end(), '.', '/');
      if (H5Lexists(f, ds.c_str(), H5P_DEFAULT) <= 0 ||
          H5Lexists(f, ds.substr(0, ds.rfind('/')).c_str(), H5P_DEFAULT) <= 0)
        fail_input("{}: missing dataset {}", path, ds);
      hid_t d = H5_CHECK(H5Dopen2(f, ds.c_str(), H5P_DEFAULT));
      hid_t s = H5_CHECK(H5Dget_space(d));
      int nd = H5Sget_simple_extent_ndims(s);
      std::vector<hsize_t> dims(std::max(nd, 0));
      H5Sget_simple_extent_dims(s, dims.data(), nullptr);
      Shape got(dims.begin(), dims.end());
      H5Sclose(s);
      if (got != p->shape) {
        H5Dclose(d);
        fail_input("{}: {} has shape {}; the model needs {}", path, ds, shape_str(got), shape_str(p->shape));
      }
      std::vector<float> v(size_t(numel(got)));
      herr_t rc = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      H5Dclose(d);
      if (rc < 0) fail_input("{}: cannot read {}", path, ds);
      out.tensors[p->name] = std::move(v);
      out.shapes[p->name] = got;
    }
  } catch (...) {
    H5Fclose(f);
    throw;
  }
  H5Fclose(f);
  return out;
}

void copy_parameters_into(Model& model, const LoadedParams& p, const std::string& path) {
  for (auto* q : model.params()) {
    auto it = p.tensors.find(q->name);
    if (it == p.tensors.end()) fail_input("{}: has no parameter {}", path, q->name);
    if (int64_t(it->second.size()) != numel(q->shape))
      fail_input("{}: {} has {} values; the model needs {}", path, q->name, it->second.size(), numel(q->shape));
    std::copy(it->second.begin(), it->second.end(), q->value);
  }
}


}  // namespace strata
