// Datasets in HDF5 and the loader that gives each rank its slice of every global batch.
//
// Accepted layout (README "Data format"): for each split S in {train, test}
//   /S/images  uint8 or float32, shape (N, H, W) or (N, C, H, W); uint8 is scaled by 1/255
//   /S/labels  uint8, int32 or int64, shape (N,), values in [0, classes)
// Root attribute "classes" (integer) gives the class count; if absent, max(label)+1 of train.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/tensor.h"

namespace strata {

struct SplitInfo {
  std::string name;      // "train" / "test"
  int64_t n = 0;         // samples
  Shape sample_shape;    // (C, H, W)
  bool images_u8 = true; // else float32
};

struct DatasetInfo {
  std::string path;
  int classes = 0;
  SplitInfo train;
  bool has_test = false;
  SplitInfo test;
  std::string source_sha256;  // provenance attribute, "" if absent
};

// Opens and validates the file: datasets present, ranks/dtypes/shapes consistent, and every
// label in range (labels are small: all are read once). Throws UserError (kExitBadInput)
// naming the file and dataset at fault.
DatasetInfo open_dataset(const std::string& path);

// The HDF5 build here is not thread-safe, and Loader threads call it in the background: any
// code that calls HDF5 while a Loader may be alive (checkpoints, parameter files) must hold
// this lock around those calls. open_dataset, Loader and prepare_fashion_mnist take it.
std::mutex& hdf5_mutex();

// Global order of one epoch: a permutation of [0, n) that depends on (seed, epoch) only.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// Reads this rank's slice of each global batch of a split. Batch i of an epoch covers
// order[i*G, (i+1)*G); rank r of R reads the contiguous part [r*G/R, (r+1)*G/R) of that range.
// A trailing partial batch is dropped when shuffling (training); for evaluation (shuffle=false)
// the last batch is partial and split as evenly as possible.
// A split whose images fit in STRATA_DATA_CACHE_MB (default 512 MiB per rank) is read whole,
// once, by the constructor; next() then gathers and converts this rank's rows from memory on
// the calling thread (and prefetches the next batch's rows), with no thread and no HDF5 call.
// A larger split (or STRATA_DATA_CACHE_MB=0) is streamed: a background thread reads the next
// batch from the file while the current one is in use (double buffering); it is the only
// thread that touches HDF5 while a Loader is alive. Both give the same batches.
class Loader {
 public:
  Loader(const DatasetInfo& info, const std::string& split, int64_t global_batch, int rank,
         int ranks, bool shuffle, uint64_t seed);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  // Positions the loader at (epoch, batch); the next call to next() returns that batch.
  void seek(int64_t epoch, int64_t batch);
  struct Batch {
    Tensor x;                     // (b, C, H, W), b = this rank's share
    std::vector<int32_t> y;       // (b)
    int64_t epoch = 0, index = 0; // which global batch this is
    int64_t first_sample = 0;     // position of this rank's first sample within the global
                                  // batch, r*g/R for a batch of g samples (g = G except in a
                                  // partial evaluation batch); dropout keys its masks on it
  };
  // Returns the next batch (advancing across epoch boundaries). The reference stays valid until
  // the next call.
  const Batch& next();

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace strata
