// The validated datasets of image and token files, shared by the validation of a data file
// (dataset.cpp) and the loader (loader.cpp). Callers hold hdf5_mutex() (data.h).
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/hdf5_util.h"
#include "data/data.h"
#include "strata/error.h"

namespace strata {

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

// Opens a data or token file read-only (a missing or unreadable file: the OS's reason), without
// HDF5's sieve buffer (see dataset.cpp).
H5Id open_h5(const std::string& path);

struct Dataset {
  std::string name;  // "/train/images"
  H5Id id, type;
  std::vector<hsize_t> dims;
};

// One split, validated: its images dataset stays open (the Loader reads rows from it).
struct Split {
  SplitInfo info;
  Dataset images;
  std::vector<int64_t> labels;
};

// A split's images and labels (`name`: "train" or "test"), validated: dtypes, shapes, sizes
// within what the kernels and memory take, labels read, float images finite.
Split read_split(const std::string& path, hid_t file, const std::string& name);
// A token dataset, validated: dtype (uint8, uint16 or int32), rank 1, not empty.
Dataset open_tokens(const std::string& path, hid_t file, const std::string& name);
// The native type tokens of `bytes` bytes are read as (the stored width: no conversion).
hid_t token_mem_type(size_t bytes);
// open_dataset for one HDF5 file.
DatasetInfo open_hdf5_dataset(const std::string& path);
// Every label of /SPLIT/labels in [0, classes).
void check_labels(const std::string& path, const std::string& split,
                  const std::vector<int64_t>& labels, int64_t classes);

}  // namespace strata
