// The parallel writer (writer.h): a checkpoint written by every rank at once (ZeRO), parallel
// HDF5 over MPI-IO, each rank writing its shard of its stage's flat buffers into the whole
// tensors of the one file.
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <map>

#include <fmt/format.h>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_write.h"
#include "checkpoint/writer.h"
#include "data/data.h"
#include "strata/error.h"

namespace strata {
namespace {

// One dataset of the file and where its elements come from: flat-buffer elements
// [offset, offset + numel(shape)), element i at base[i - base_at] on this rank; base null:
// another stage's tensor.
struct Dataset {
  std::string path;
  Shape shape;
  int64_t offset;
  const float* base;
  int64_t base_at;
};

// Selects elements [a, b) (row-major order) of the sub-array of `dims` below the fixed
// indices start[0, axis), as a union of hyperslabs: a partial row, whole rows, a partial row.
void select_range(hid_t space, const std::vector<hsize_t>& dims, size_t axis,
                  std::vector<hsize_t>& start, int64_t a, int64_t b, bool& first) {
  if (a >= b) return;
  int64_t inner = 1;
  for (size_t k = axis + 1; k < dims.size(); ++k) inner *= int64_t(dims[k]);
  auto add = [&](int64_t i, int64_t rows) {  // rows [i, i + rows) of this axis, all below
    std::vector<hsize_t> s = start, count(dims.size(), 1);
    s[axis] = hsize_t(i);
    count[axis] = hsize_t(rows);
    for (size_t k = axis + 1; k < dims.size(); ++k) s[k] = 0, count[k] = dims[k];
    H5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, s.data(),
                                 nullptr, count.data(), nullptr));
    first = false;
  };
  const int64_t i0 = (a + inner - 1) / inner, i1 = b / inner;  // whole rows [i0, i1)
  if (i0 > i1) {  // inside one row
    start[axis] = hsize_t(a / inner);
    select_range(space, dims, axis + 1, start, a % inner, a % inner + (b - a), first);
    return;
  }
  if (a < i0 * inner) {
    start[axis] = hsize_t(i0 - 1);
    select_range(space, dims, axis + 1, start, a - (i0 - 1) * inner, inner, first);
  }
  if (i1 > i0) add(i0, i1 - i0);
  if (i1 * inner < b) {
    start[axis] = hsize_t(i1);
    select_range(space, dims, axis + 1, start, 0, b - i1 * inner, first);
  }
}

// The file's CRC-32 of each dataset from every rank's CRC of its piece (rank order is
// flat-buffer order): zlib's crc32_combine.
std::vector<int64_t> combined_crcs(Comm& comm, const std::vector<uint32_t>& crc,
                                   const std::vector<int64_t>& len) {
  const size_t n = crc.size(), R = size_t(comm.size()), me = size_t(comm.rank());
  std::vector<double> all(2 * n * R, 0.0);  // exact: CRCs < 2^32, lengths < 2^53
  for (size_t i = 0; i < n; ++i) all[me * n + i] = crc[i], all[(R + me) * n + i] = double(len[i]);
  comm.allreduce_sum(all.data(), int64_t(all.size()));
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    uLong c = crc32(0L, Z_NULL, 0);
    for (size_t r = 0; r < R; ++r) {
      const auto bytes = z_off_t(all[(R + r) * n + i]) * 4;
      if (bytes > 0) c = crc32_combine(c, uLong(all[r * n + i]), bytes);
    }
    out[i] = int64_t(c);
  }
  return out;
}

// The text of rank 0 on every rank (attributes must be written with the same value by all).
std::string from_rank0(Comm& comm, const std::string& s) {
  int64_t n = int64_t(s.size());
  comm.broadcast(&n, sizeof n, 0);
  std::string out = s;
  out.resize(size_t(n));
  comm.broadcast(out.data(), n, 0);
  return out;
}

// Every rank or none goes on: a failure on some ranks throws on all, so no rank is left in a
// collective call the others never make.
void agree(Comm& comm, const std::string& error, const std::string& what) {
  int64_t failed = error.empty() ? 0 : 1;
  comm.allreduce_sum(&failed, 1);
  if (failed == 0) return;
  throw std::runtime_error(error.empty() ? fmt::format("{} failed on {} of {} ranks", what, failed,
                                                       comm.size())
                                         : error);
}

// This rank's elements of a dataset as a file selection and a 1-D memory space (empty where it
// holds none: every rank takes part in each collective write).
// This rank's piece of a dataset: its elements [first, first + count) (row-major) and where
// they are here.
struct Piece {
  int64_t first = 0, count = 0;
  const float* src = nullptr;
};
Piece piece_of(const Dataset& t, OptimShard mine) {
  if (!t.base) return {};  // another stage's tensor
  const int64_t a = std::max(mine.begin, t.offset), b = std::min(mine.end, t.offset + numel(t.shape));
  if (b <= a) return {};
  return {a - t.offset, b - a, t.base + (a - t.base_at)};
}

struct Selection {
  H5Id file, mem;
  const float* src = nullptr;
};
Selection select_piece(const Dataset& t, OptimShard mine) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  if (dims.empty()) dims = {1};
  Selection sel{H5Id(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose), {}};
  const Piece p = piece_of(t, mine);
  const hsize_t n = hsize_t(p.count), one = 1;
  sel.mem = H5Id(H5_CHECK(H5Screate_simple(1, n ? &n : &one, nullptr)), H5Sclose);
  if (n == 0) {
    H5_CHECK(H5Sselect_none(sel.mem.get()));
    H5_CHECK(H5Sselect_none(sel.file.get()));
    return sel;
  }
  std::vector<hsize_t> start(dims.size(), 0);
  bool first = true;
  select_range(sel.file.get(), dims, 0, start, p.first, p.first + p.count, first);
  sel.src = p.src;
  return sel;
}

void write_datasets(Comm& comm, hid_t f, const std::vector<Dataset>& sets,
                    const std::vector<int64_t>& crcs, OptimShard mine) {
  const TensorPlists pl = tensor_plists();
  H5Id xfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  H5_CHECK(H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_COLLECTIVE));
  for (size_t i = 0; i < sets.size(); ++i) {
    const Dataset& t = sets[i];
    Selection sel;
    std::string error;
    try {  // local: the selection
      sel = select_piece(t, mine);
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(comm, error, "selecting " + t.path);
    try {  // collective: creation, the CRC attribute, the write
      H5Id d(H5_CHECK(H5Dcreate2(f, t.path.c_str(), H5T_IEEE_F32LE, sel.file.get(), pl.link.get(),
                                 pl.dataset.get(), H5P_DEFAULT)),
             H5Dclose);
      write_int_attr(d.get(), "crc32", crcs[i]);
      // (creation reads only the space's extent; the write, its selection)
      H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, sel.mem.get(), sel.file.get(), xfer.get(), sel.src));
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(comm, error, "writing " + t.path);
  }
}

// Every dataset of the whole model, in the same order on every rank (creation is collective),
// and where this rank's stage holds it: its parameters but the token table's copy (a
// pipeline's last stage; the first stage writes the table).
std::vector<Dataset> datasets_of(const Model& model, Optimizer& opt) {
  std::map<std::string, const Param*> here;
  for (const Param* p : model.params())
    if (!model.tied().is_copy(p)) here[p->name] = p;
  const auto whole = describe_params(model.spec(), model.input_shape(), model.classes());
  std::vector<Dataset> sets;
  auto add = [&](const std::string& path, const Shape& shape, const std::string& name,
                 const float* state, int64_t state_at) {
    const auto it = here.find(name);
    if (it == here.end()) {  // another stage's
      sets.push_back({path, shape, 0, nullptr, 0});
      return;
    }
    const Param* p = it->second;
    sets.push_back(state ? Dataset{path, shape, p->offset, state, state_at}
                         : Dataset{path, shape, p->offset, p->host, p->offset});
  };
  for (const auto& [name, shape] : whole) add(param_path(name), shape, name, nullptr, 0);
  for (auto& [state, t] : opt.state())
    for (const auto& [name, shape] : whole)
      add("/optimizer/" + state + param_path(name).substr(7), shape, name, t->data(),
          opt.state_base());
  return sets;
}

// The temporary file, written collectively; "" or what failed on this rank.
std::string write_file(Comm& comm, const std::string& tmp, MPI_Comm mpi, const Model& model,
                       const TrainState& st, const Provenance& prov,
                       const std::vector<Dataset>& sets, const std::vector<int64_t>& crcs,
                       OptimShard mine) {
  std::lock_guard lock(hdf5_mutex());  // this HDF5 build is not thread-safe
  h5_quiet();
  H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST));
  H5_CHECK(H5Pset_fapl_mpio(fapl.get(), mpi, MPI_INFO_NULL));
  hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (f < 0) return "cannot create the file";  // MPI_File_open is collective: on every rank
  std::string error;
  try {
    write_checkpoint_attrs(f, model, st, prov);
    write_datasets(comm, f, sets, crcs, mine);
    H5_CHECK(H5Fflush(f, H5F_SCOPE_GLOBAL));  // MPI_File_sync: every rank's writes durable
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (H5Fclose(f) < 0 && error.empty()) error = "closing the file failed";
  return error;
}

// Collective over `comm` (every rank of the run, MPI): each rank writes its ZeRO shard
// [opt.shard()) of its stage's parameters (`model`: this rank's stage, whole tensors, values
// identical over the stage's replicas) and of the optimizer state; comm's rank order is each
// stage's replica order. Each tensor's CRC-32 is combined from the ranks' CRCs of their pieces
// (zlib's crc32_combine) before the write; temporary name, MPI_File_sync, then rank 0's fsync
// and rename. The caller has checked every value finite. Returns the file's size on every
// rank; throws UserError on every rank if any failed.
int64_t write_sharded(Comm& comm, const std::string& path, const Model& model, Optimizer& opt,
                      const TrainState& st, const Provenance& prov) {
  const auto* mpi = static_cast<const MPI_Comm*>(comm.mpi_handle());
  STRATA_CHECK(mpi && opt.num_params() == model.num_params(),
               "a sharded checkpoint is written over MPI from the stage's shards");
  int64_t pid = ::getpid();
  comm.broadcast(&pid, sizeof pid, 0);
  const std::string tmp = fmt::format("{}.tmp.{}", path, pid);
  const OptimShard mine = opt.shard();
  const std::vector<Dataset> sets = datasets_of(model, opt);
  std::vector<uint32_t> crc;  // of this rank's piece of each dataset
  std::vector<int64_t> len;
  for (const Dataset& t : sets) {
    const Piece p = piece_of(t, mine);
    len.push_back(p.count);
    crc.push_back(p.count ? crc32_of(p.src, p.count) : 0);
  }
  const std::vector<int64_t> crcs = combined_crcs(comm, crc, len);
  Provenance same = prov;
  same.created_utc = from_rank0(comm, prov.created_utc);
  std::string error = write_file(comm, tmp, *mpi, model, st, same, sets, crcs, mine);
  int64_t failed = error.empty() ? 0 : 1;
  comm.allreduce_sum(&failed, 1);
  int64_t size = 0;
  if (comm.rank() == 0) {
    struct stat sb{};
    try {
      if (failed == 0 && ::stat(tmp.c_str(), &sb) == 0) {
        publish_file(tmp, path);  // fsync, rename, fsync of the directory
        size = int64_t(sb.st_size);
      }
    } catch (const UserError& e) {
      error = e.what();
    }
    if (size == 0) std::remove(tmp.c_str());
  }
  comm.broadcast(&size, sizeof size, 0);
  if (size == 0)
    throw UserError(kExitBadInput, fmt::format("{}: writing failed, previous file left as it "
                                               "was: {}", path, error.empty() ? fmt::format(
                                                   "{} of {} ranks could not write", failed,
                                                   comm.size()) : error));
  return size;
}

class ParallelWriter final : public CheckpointWriter {
 public:
  explicit ParallelWriter(Comm& comm) : comm_(comm) {}
  CheckpointWriterKind kind() const override { return CheckpointWriterKind::kParallel; }
  bool every_rank_writes() const override { return true; }
  int64_t write(const std::string& path, const CheckpointContent& c) override {
    STRATA_CHECK(c.opt, "a checkpoint holds the optimizer state");
    return write_sharded(comm_, path, c.model, *c.opt, c.state, c.prov);
  }

 private:
  Comm& comm_;
};

}  // namespace

std::unique_ptr<CheckpointWriter> make_parallel_writer(Comm& comm) {
  return std::make_unique<ParallelWriter>(comm);
}

}  // namespace strata
