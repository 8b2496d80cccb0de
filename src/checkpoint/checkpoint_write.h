// What the two checkpoint writers share (checkpoint.cpp: rank 0's; checkpoint_sharded.cpp:
// every rank's shard through parallel HDF5): the root attributes and the tensors' CRC-32.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/hdf5_util.h"
#include "checkpoint/checkpoint.h"

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

// int8 files (checkpoint_int8.cpp): "/int8/fc1/weight" for the product "fc1.weight"; the root
// attribute and the int8 datasets (written inside write_atomically's attribute step), the
// float tensors of the products (scale, act_scale); the products' q shapes and data on read.
std::string int8_path(const std::string& product);
std::vector<std::pair<std::string, std::string>> parse_int8_products(const std::string& text,
                                                                     const std::string& path);
void write_int8_products(hid_t f, const Int8Table& table);
std::vector<NamedTensor> int8_float_tensors(const Int8Table& table);
Shape int8_q_shape(hid_t f, const std::string& path, const std::string& product);
void read_int8_products(hid_t f, const std::string& path, LoadedCheckpoint& out,
                        bool tolerate_mismatch);

}  // namespace strata
