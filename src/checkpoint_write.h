// What the two checkpoint writers share (checkpoint.cpp: rank 0's; checkpoint_sharded.cpp:
// every rank's shard through parallel HDF5): the root attributes and the tensors' CRC-32.
#pragma once
#include <hdf5.h>

#include <cstdint>

#include "strata/checkpoint.h"
#include "hdf5_util.h"

namespace strata {

// CRC-32 (zlib's) of n floats' bytes.
uint32_t crc32_of(const float* p, int64_t n);
// How both writers create a tensor: intermediate groups made on the way (link creation) and
// contiguous storage allocated at creation, never filled (dataset creation).
struct TensorPlists {
  H5Id link, dataset;
};
TensorPlists tensor_plists();
// Every root attribute of a checkpoint: the model, the train state and the provenance.
void write_checkpoint_attrs(hid_t f, const Model& model, const TrainState& st,
                            const Provenance& prov);

}  // namespace strata
