#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <functional>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <thread>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "base/memory.h"
#include "base/read_guard.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint_write.h"
#include "data/data.h"
#include "data/tokenizer_identity.h"
#include "model/layers.h"
#include "model/optim.h"
#include "strata/error.h"
#include "strata/version.h"

namespace strata {
namespace {


[[noreturn]] void fail_checkpoint(const std::string& msg) {
  throw UserError(kExitBadCheckpoint, msg);
}

std::string join(const std::vector<std::string>& v, char sep) {
  std::string o;
  for (size_t i = 0; i < v.size(); ++i) o += (i ? std::string(1, sep) : "") + v[i];
  return o;
}
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (size_t a = 0, b; a < s.size(); a = b + 1) {
    b = s.find(sep, a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
  }
  return out;
}

int64_t count_nonfinite(const float* p, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  return bad;
}

std::string dir_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

int64_t int_attr(hid_t f, const char* name, const std::string& path, bool required = true) {
  std::vector<int64_t> v;
  if (!read_int_attr(f, name, &v) || v.size() != 1) {
    if (!required) return 0;
    fail_checkpoint(fmt::format("{}: root attribute '{}' is missing", path, name));
  }
  return v[0];
}

// Writes all of `buf` at `offset`, kicking off writeback every 16 MiB so that the final fsync
// has little left to wait for (the disk works while we copy). False on an I/O error.
bool pwrite_all(int fd, const char* buf, int64_t bytes, int64_t offset) {
  constexpr int64_t kChunk = int64_t(16) << 20;
  for (int64_t done = 0; done < bytes;) {
    const int64_t want = std::min(kChunk, bytes - done);
    const ssize_t n = ::pwrite(fd, buf + done, size_t(want), offset + done);
    if (n <= 0) return false;
    ::sync_file_range(fd, offset + done, n, SYNC_FILE_RANGE_WRITE);
    done += n;
  }
  return true;
}



// Every dataset in the file, by absolute path.
std::vector<std::string> list_datasets(hid_t f) {
  std::vector<std::string> out;
  auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type == H5O_TYPE_DATASET)
      static_cast<std::vector<std::string>*>(data)->push_back(std::string("/") + name);
    return 0;
  };
  H5_CHECK(H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out));
  return out;
}

}  // namespace

// Writes `tensors` and the attributes `write_attrs` puts on the root into a new HDF5 file,
// atomically: temporary name, fsync, rename, fsync of the directory. Returns the file's size.
//
// Speed: HDF5 lays out the file (metadata, and contiguous space for every tensor allocated at
// creation); the tensor bytes then go straight from memory to their offsets with pwrite, with
// no HDF5 copy, while a second thread computes their CRCs, which are filled in last. HDF5
// calls hold hdf5_mutex() only for the short metadata phases, so a loader thread is not held
// up by the bulk of the write.
int64_t write_atomically(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::function<void(hid_t)>& write_attrs) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  auto fail_write = [&](const std::string& why) {
    std::remove(tmp.c_str());
    throw UserError(kExitBadInput, fmt::format("{}: writing failed, previous file left as it "
                                               "was: {}", path, why));
  };
  std::vector<int64_t> offsets;
  {
    std::lock_guard lock(hdf5_mutex());  // this HDF5 build is not thread-safe
    h5_quiet();
    // Object headers with checksums (file format of HDF5 1.8+), so damaged metadata is
    // detected by the library as well as damaged tensors by our CRCs.
    H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
    hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
    if (f < 0)
      throw UserError(kExitBadInput, fmt::format("{}: cannot create the file (is {} a writable "
                                                 "directory?)", path, dir_of(path)));
    try {
      write_attrs(f);
      const TensorPlists pl = tensor_plists();
      for (const auto& t : tensors) {
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        H5Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
        H5Id d(H5_CHECK(H5Dcreate2(f, t.path.c_str(), H5T_IEEE_F32LE, space.get(), pl.link.get(),
                                   pl.dataset.get(), H5P_DEFAULT)),
               H5Dclose);
        write_int_attr(d.get(), "crc32", int64_t(0));  // filled in once the data is written
        const haddr_t at = H5Dget_offset(d.get());
        offsets.push_back(at == HADDR_UNDEF ? -1 : int64_t(at));
      }
      H5_CHECK(H5Fclose(f));
    } catch (const std::exception& e) {
      H5Fclose(f);
      fail_write(e.what());
    }
  }
  // The CRCs, and a count of non-finite values: nothing NaN/Inf is ever published.
  std::vector<uint32_t> crcs(tensors.size());
  std::vector<int64_t> nonfinite(tensors.size());
  std::thread crc_thread([&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      crcs[i] = crc32_of(tensors[i].data, numel(tensors[i].shape));
      nonfinite[i] = count_nonfinite(tensors[i].data, numel(tensors[i].shape));
    }
  });
  int fd = ::open(tmp.c_str(), O_WRONLY);
  bool ok = fd >= 0;
  for (size_t i = 0; ok && i < tensors.size(); ++i)
    if (offsets[i] >= 0)
      ok = pwrite_all(fd, reinterpret_cast<const char*>(tensors[i].data),
                      numel(tensors[i].shape) * 4, offsets[i]);
  int err = errno;
  crc_thread.join();
  if (fd >= 0) ::close(fd);
  if (!ok) fail_write(std::strerror(err));
  for (size_t i = 0; i < tensors.size(); ++i)
    if (nonfinite[i] > 0) {
      std::remove(tmp.c_str());
      throw UserError(kExitDiverged, fmt::format("{}: not written: {} holds {} NaN/Inf values "
                                                 "(training diverged)", path, tensors[i].path,
                                                 nonfinite[i]));
    }
  {
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) fail_write("cannot reopen to store the checksums");
    try {
      for (size_t i = 0; i < tensors.size(); ++i) {
        H5Id d(H5_CHECK(H5Dopen2(f, tensors[i].path.c_str(), H5P_DEFAULT)), H5Dclose);
        H5Id a(H5_CHECK(H5Aopen(d.get(), "crc32", H5P_DEFAULT)), H5Aclose);
        const int64_t v = crcs[i];
        H5_CHECK(H5Awrite(a.get(), H5T_NATIVE_INT64, &v));
      }
      H5_CHECK(H5Fclose(f));
    } catch (const std::exception& e) {
      H5Fclose(f);
      fail_write(e.what());
    }
  }
  struct stat sb{};
  if (::stat(tmp.c_str(), &sb) != 0) fail_write(std::strerror(errno));
  publish_file(tmp, path);
  return int64_t(sb.st_size);
}

void write_model_attrs(hid_t f, const Model& model, const char* format) {
  write_str_attr(f, "format", format);
  write_int_attr(f, "format_version", int64_t(1));
  write_str_attr(f, "strata_version", STRATA_VERSION);
  write_str_attr(f, "git_commit", git_commit());
  std::string layers;
  for (auto& l : model.spec()) layers += l.text() + "\n";
  write_str_attr(f, "model_layers", layers);
  write_int_attr(f, "input_shape", model.input_shape());
  write_int_attr(f, "classes", int64_t(model.classes()));
  // A padded token table (model.pad_vocab): its rows past the vocabulary are zero padding, and
  // readers outside strata (export) learn the real vocabulary here.
  for (const LayerSpec& l : model.spec())
    if (l.kind == LayerSpec::Kind::kEmbedding && padded_vocab(model.classes(), l.pad) != model.classes())
      write_int_attr(f, "vocab_size", int64_t(model.classes()));
}

uint32_t crc32_of(const float* p, int64_t n) {
  // zlib's crc32 takes at most UINT_MAX bytes per call on some builds: feed it in slices.
  uLong crc = crc32(0L, Z_NULL, 0);
  auto* b = reinterpret_cast<const Bytef*>(p);
  for (int64_t left = n * 4; left > 0;) {
    uInt chunk = uInt(std::min<int64_t>(left, int64_t(1) << 30));
    crc = crc32(crc, b, chunk);
    b += chunk;
    left -= chunk;
  }
  return uint32_t(crc);
}

TensorPlists tensor_plists() {
  TensorPlists p{H5Id(H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose),
                 H5Id(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose)};
  H5_CHECK(H5Pset_create_intermediate_group(p.link.get(), 1));
  H5_CHECK(H5Pset_layout(p.dataset.get(), H5D_CONTIGUOUS));
  H5_CHECK(H5Pset_alloc_time(p.dataset.get(), H5D_ALLOC_TIME_EARLY));
  H5_CHECK(H5Pset_fill_time(p.dataset.get(), H5D_FILL_TIME_NEVER));
  return p;
}

void write_checkpoint_attrs(hid_t f, const Model& model, const TrainState& st,
                            const Provenance& prov) {
  write_model_attrs(f, model, kCheckpointFormat);
  write_int_attr(f, "step", st.step);
  write_int_attr(f, "epoch", st.epoch);
  write_int_attr(f, "batch_in_epoch", st.batch);
  write_int_attr(f, "sequence", st.sequence);
  write_int_attr(f, "global_batch", st.global_batch);
  write_int_attr(f, "seed", int64_t(st.seed));
  // All of strata's randomness is a pure function of these counters, so the seed and the
  // position above are the complete RNG state.
  write_str_attr(f, "rng", "counter-based: init(seed, tensor name), shuffle(seed, epoch), "
                           "dropout(seed, step, sample position); no hidden state");
  write_str_attr(f, "optimizer", st.optimizer);
  write_int_attr(f, "optimizer_steps", st.optimizer_steps);
  write_str_attr(f, "config", prov.config_toml);
  write_str_attr(f, "dataset_path", prov.dataset_path);
  write_str_attr(f, "dataset_sha256", prov.dataset_sha256);
  write_int_attr(f, "grid", std::vector<int64_t>{prov.grid_ranks, prov.grid_data_parallel,
                                                 prov.grid_stages, prov.grid_tensor});
  write_str_attr(f, "slurm_job_id", prov.slurm_job_id);
  write_int_attr(f, "slurm_restart_count", prov.slurm_restart_count);
  write_str_attr(f, "hosts", join(prov.hosts, ','));
  write_str_attr(f, "created_utc", prov.created_utc);
  write_tokenizer_attrs(f, prov.tokenizer);
}

std::string param_path(const std::string& global_name) {
  std::string p = "/params/" + global_name;
  std::replace(p.begin() + 8, p.end(), '.', '/');
  return p;
}

std::vector<NamedTensor> model_tensors(const Model& model) {
  std::vector<NamedTensor> out;
  for (const Param* p : model.params()) out.push_back({param_path(p->name), p->shape, p->host});
  return out;
}

void save_parameters(const std::string& path, const Model& model, const ParamFileMeta& meta) {
  write_atomically(path, model_tensors(model), [&](hid_t f) {
    write_model_attrs(f, model, kParamsFormat);
    write_int_attr(f, "step", meta.step);
    write_str_attr(f, "config", meta.config_toml);
    write_str_attr(f, "dataset_sha256", meta.dataset_sha256);
    write_tokenizer_attrs(f, meta.tokenizer);
  });
}

namespace {

constexpr int64_t kFormatVersion = 1;
constexpr int64_t kMaxClasses = int64_t(1) << 24;  // labels and token ids travel as float32

// A root attribute that must be there: an integer in [lo, hi].
int64_t checked_int_attr(hid_t f, const char* name, const std::string& path, int64_t lo,
                         int64_t hi) {
  const int64_t v = int_attr(f, name, path);
  if (v < lo || v > hi)
    fail_checkpoint(fmt::format("{}: root attribute {} = {} is out of range [{}, {}]", path, name,
                                v, lo, hi));
  return v;
}

// The model the file describes: its attributes, checked, and the tensors it must hold (global
// path -> shape), from model_layers alone: nothing is read or allocated yet.
std::map<std::string, Shape> expected_tensors(hid_t f, const std::string& path,
                                              LoadedCheckpoint& out) {
  std::string layers;
  std::vector<int64_t> shape;
  if (!read_str_attr(f, "model_layers", &layers) || !read_int_attr(f, "input_shape", &shape))
    fail_checkpoint(fmt::format("{}: missing model description attributes (model_layers, "
                                "input_shape)", path));
  if (shape.empty() || shape.size() > 3 ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 1 || d > INT32_MAX; }) ||
      numel(shape) > INT32_MAX)
    fail_checkpoint(fmt::format("{}: root attribute input_shape = {} is not a sample shape", path,
                                shape_str(shape)));
  out.input_shape = shape;
  out.classes = int(checked_int_attr(f, "classes", path, 1, kMaxClasses));
  std::vector<std::pair<std::string, Shape>> params;
  try {
    const std::string where = fmt::format("{}: root attribute model_layers", path);
    out.spec = parse_model_spec(split(layers, '\n'), where);
    params = describe_params(out.spec, out.input_shape, out.classes, where);
  } catch (const UserError& e) {
    throw UserError(kExitBadCheckpoint, e.what());
  }
  std::map<std::string, Shape> want;
  for (const auto& [name, sh] : params) want[param_path(name)] = sh;
  if (out.format == kInt8Format) {
    std::string list;
    if (!read_str_attr(f, "int8_products", &list))
      fail_checkpoint(fmt::format("{}: an int8 file without the root attribute int8_products", path));
    for (const auto& [name, source] : parse_int8_products(list, path)) {
      const Shape q = int8_q_shape(f, path, name);
      Int8Weight& w = out.int8.weights[name];
      w.source = source;
      w.rows = int(q[0]);
      w.cols = int(q[1]);
      want[int8_path(name) + "/scale"] = {q[0]};
      want[int8_path(name) + "/act_scale"] = {1};
      if (name == source) want.erase(param_path(name));  // the weight is only in int8
    }
  }
  if (out.format == kCheckpointFormat)
    for (const std::string& state : Optimizer::state_names(out.state.optimizer))
      for (const auto& [name, sh] : params)
        want["/optimizer/" + state + param_path(name).substr(7)] = sh;
  return want;
}

// A dataset's shape, dtype and storage, checked against what strata writes before any of it
// is read: float32, the expected shape, stored whole (contiguous, no filters).
void check_dataset(hid_t d, const std::string& path, const std::string& ds, const Shape& want) {
  H5Id space(H5_CHECK(H5Dget_space(d)), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0 || nd > 8) fail_checkpoint(fmt::format("{}: {} has a damaged dataspace", path, ds));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const Shape got(dims.begin(), dims.end());
  if (got != want)
    fail_checkpoint(fmt::format("{}: {} has shape {}; the model in the file (model_layers) needs {}",
                                path, ds, shape_str(got), shape_str(want)));
  H5Id type(H5_CHECK(H5Dget_type(d)), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4)
    fail_checkpoint(fmt::format("{}: {} is not float32", path, ds));
  if (int64_t(H5Dget_storage_size(d)) != numel(want) * 4)
    fail_checkpoint(fmt::format("{}: {} holds {} bytes of data; its shape needs {} (truncated "
                                "or not written by strata)", path, ds,
                                int64_t(H5Dget_storage_size(d)), numel(want) * 4));
}

void read_state_attrs(hid_t f, const std::string& path, LoadedCheckpoint& out) {
  const int64_t version = int_attr(f, "format_version", path);
  if (version != kFormatVersion)
    fail_checkpoint(fmt::format("{}: format_version {} is not one this strata reads ({})", path,
                                version, kFormatVersion));
  out.state.step = checked_int_attr(f, "step", path, 0, INT64_MAX);
  read_str_attr(f, "config", &out.prov.config_toml);
  read_str_attr(f, "dataset_sha256", &out.prov.dataset_sha256);
  out.prov.tokenizer = read_tokenizer_attrs(f);
  if (out.format != kCheckpointFormat) return;
  TrainState& s = out.state;
  s.epoch = checked_int_attr(f, "epoch", path, 0, INT64_MAX);
  s.batch = checked_int_attr(f, "batch_in_epoch", path, 0, INT64_MAX);
  s.sequence = checked_int_attr(f, "sequence", path, 1, INT64_MAX);
  s.global_batch = checked_int_attr(f, "global_batch", path, 1, INT64_MAX);
  s.seed = uint64_t(int_attr(f, "seed", path));
  s.optimizer_steps = checked_int_attr(f, "optimizer_steps", path, 0, INT64_MAX);
  read_str_attr(f, "optimizer", &s.optimizer);
  if (s.optimizer != "sgd" && s.optimizer != "adamw")
    fail_checkpoint(fmt::format("{}: root attribute optimizer = '{}' is not sgd or adamw", path,
                                s.optimizer.substr(0, 40)));
  Provenance& p = out.prov;
  read_str_attr(f, "dataset_path", &p.dataset_path);
  read_str_attr(f, "slurm_job_id", &p.slurm_job_id);
  read_str_attr(f, "created_utc", &p.created_utc);
  std::string hosts;
  read_str_attr(f, "hosts", &hosts);
  p.hosts = split(hosts, ',');
  p.slurm_restart_count = int_attr(f, "slurm_restart_count", path, false);
  std::vector<int64_t> grid;
  if (read_int_attr(f, "grid", &grid) && grid.size() >= 3) {  // 3: before tensor
    p.grid_ranks = grid[0];
    p.grid_data_parallel = grid[1];
    p.grid_stages = grid[2];
    p.grid_tensor = grid.size() > 3 ? grid[3] : 1;
  }
}

}  // namespace

LoadedCheckpoint read_checkpoint(const std::string& path, bool tolerate_mismatch,
                                 bool quarantine_if_damaged) {
  const auto t0 = std::chrono::steady_clock::now();
  // A path that is not there or not a file is the user's to fix (exit 2); a file that is there
  // but cannot be used is a bad checkpoint (exit 4).
  struct stat sb{};
  if (::stat(path.c_str(), &sb) != 0 || ::access(path.c_str(), R_OK) != 0)
    fail_input("{}: cannot open ({})", path, std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) fail_input("{}: cannot open (not a regular file)", path);
  std::lock_guard lock(hdf5_mutex());
  ReadGuard guard(path, int64_t(sb.st_size), kExitBadCheckpoint, quarantine_if_damaged);
  h5_quiet();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    fail_checkpoint(fmt::format("{}: not an HDF5 file (truncated or overwritten?)", path));
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0)
    fail_checkpoint(fmt::format("{}: damaged or truncated HDF5 file ({})", path, h5_error_detail()));
  LoadedCheckpoint out;
  try {
    if (!read_str_attr(f.get(), "format", &out.format) ||
        (out.format != kCheckpointFormat && out.format != kParamsFormat &&
         out.format != kInt8Format)) {
      // Under a name strata gives its checkpoints, damaged metadata rather than another file.
      if (is_checkpoint_name(path.substr(path.find_last_of('/') + 1)))
        fail_checkpoint(fmt::format("{}: damaged: its root attribute 'format' is missing or "
                                    "unknown, under a strata checkpoint's name", path));
      fail_input("{}: not a strata checkpoint or parameter file (root attribute 'format' is "
                 "missing)", path);
    }
    read_state_attrs(f.get(), path, out);
    const std::map<std::string, Shape> want = expected_tensors(f.get(), path, out);
    const std::vector<std::string> present = list_datasets(f.get());
    for (const std::string& ds : present)
      if (!want.count(ds) && !(out.format == kInt8Format && ds.rfind("/int8/", 0) == 0 &&
                               ds.size() > 2 && ds.compare(ds.size() - 2, 2, "/q") == 0))
        fail_checkpoint(fmt::format("{}: holds {}, which is not a tensor of the model in the "
                                    "file (model_layers)", path, ds));
    // Every tensor's shape, type and storage first: the file holds what it claims before the
    // memory for it is asked for.
    std::map<std::string, H5Id> opened;
    for (const auto& [ds, shape] : want) {
      if (std::find(present.begin(), present.end(), ds) == present.end())
        fail_checkpoint(fmt::format("{}: tensor {} is missing", path, ds));
      H5Id d(H5Dopen2(f.get(), ds.c_str(), H5P_DEFAULT), H5Dclose);
      if (d.get() < 0) fail_checkpoint(fmt::format("{}: cannot open dataset {}", path, ds));
      check_dataset(d.get(), path, ds, shape);
      opened[ds] = std::move(d);
    }
    int64_t bytes = 0;
    for (const auto& [ds, shape] : want) bytes += numel(shape) * 4;
    for (const auto& [name, w] : out.int8.weights) bytes += int64_t(w.rows) * w.cols * 5;
    require_memory(double(bytes), fmt::format("{}: reading its {} tensors", path, want.size()));
    for (const auto& [ds, shape] : want) {
      const H5Id& d = opened.at(ds);
      std::vector<float> v(size_t(numel(shape)));
      if (H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
        fail_checkpoint(fmt::format("{}: cannot read {} (truncated or damaged: {})", path, ds,
                                    h5_error_detail()));
      std::vector<int64_t> stored;
      std::string status = "none";
      if (read_int_attr(d.get(), "crc32", &stored) && stored.size() == 1) {
        const uint32_t crc = crc32_of(v.data(), int64_t(v.size()));
        if (uint32_t(stored[0]) == crc) {
          status = "ok";
        } else {
          status = fmt::format("MISMATCH (stored crc32 {:08x}, computed {:08x})",
                               uint32_t(stored[0]), crc);
          out.verified = false;
          if (!tolerate_mismatch)
            fail_checkpoint(fmt::format("{}: tensor {} fails its checksum (stored crc32 {:08x}, "
                                        "computed {:08x})", path, ds, uint32_t(stored[0]), crc));
        }
      }
      // strata never writes a non-finite tensor (a diverged run publishes nothing).
      if (const int64_t bad = count_nonfinite(v.data(), int64_t(v.size())); bad > 0) {
        status = fmt::format("NON-FINITE ({} NaN/Inf values)", bad);
        out.verified = false;
        if (!tolerate_mismatch)
          fail_checkpoint(fmt::format("{}: tensor {} holds {} NaN/Inf values", path, ds, bad));
      }
      out.checksum[ds] = status;
      out.tensor_bytes += int64_t(v.size()) * 4;
      out.shapes[ds] = shape;
      out.tensors[ds] = std::move(v);
    }
    if (out.format == kInt8Format) read_int8_products(f.get(), path, out, tolerate_mismatch);
  } catch (const UserError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;  // not the file's fault: out of memory (main reports it)
  } catch (const std::exception& e) {
    fail_checkpoint(fmt::format("{}: damaged file: {}", path, e.what()));
  }
  out.read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

LoadedParams load_parameters(const std::string& path) { return read_checkpoint(path); }

void copy_parameters_into(Model& model, const LoadedParams& p, const std::string& path,
                          Int8Table* int8) {
  if (!p.int8.weights.empty()) {
    if (!int8) fail_input("{}: an int8 file (strata quantize) where fp32 parameters are needed", path);
    std::map<std::string, Int8Target> targets;
    for (auto& t : model.int8_targets()) targets[t.name] = t;
    for (const auto& [name, w] : p.int8.weights) {
      auto t = targets.find(name);
      if (t == targets.end() || t->second.source != w.source || t->second.rows != w.rows ||
          t->second.cols != w.cols)
        fail_checkpoint(fmt::format("{}: int8 product {} ({} x {} from {}) is not one of the "
                                    "model's", path, name, w.rows, w.cols, w.source));
    }
    *int8 = p.int8;
  }
  for (auto* q : model.params()) {
    const std::string ds = param_path(q->name);
    if (p.int8.weights.count(q->name) && p.int8.weights.at(q->name).source == q->name) continue;
    auto it = p.tensors.find(ds);
    if (it == p.tensors.end()) fail_input("{}: missing dataset {}", path, ds);
    if (p.shapes.at(ds) != q->shape)
      fail_input("{}: {} has shape {}; the model needs {}", path, ds, shape_str(p.shapes.at(ds)),
                 shape_str(q->shape));
    std::copy(it->second.begin(), it->second.end(), q->host);
  }
}

}  // namespace strata
