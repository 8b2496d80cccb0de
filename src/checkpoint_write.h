// What the two checkpoint writers share (checkpoint.cpp: rank 0's; checkpoint_sharded.cpp:
// every rank's shard through parallel HDF5): the root attributes and the tensors' CRC-32.
#pragma once
#include <hdf5.h>

#include <cstdint>

#include "strata/checkpoint.h"

namespace strata {

// CRC-32 (zlib's) of n floats' bytes.
uint32_t crc32_of(const float* p, int64_t n);
// Every root attribute of a checkpoint: the model, the train state and the provenance.
void write_checkpoint_attrs(hid_t f, const Model& model, const TrainState& st,
                            const Provenance& prov);

}  // namespace strata
