// What the writers share (writer.h: rank0_writer.cpp, parallel_writer.cpp, int8_writer.cpp)
// with the format's reader (checkpoint.cpp): the format names, the atomic write, the root
// attributes and the tensors' CRC-32.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/hdf5_util.h"
#include "checkpoint/checkpoint.h"

namespace strata {

// The `format` root attribute of the three kinds of file.
inline constexpr const char* kCheckpointFormat = "strata-checkpoint";
inline constexpr const char* kParamsFormat = "strata-parameters";
inline constexpr const char* kInt8Format = "strata-int8";

// Writes `path` atomically: a temporary file in the same directory (HDF5 for the metadata and
// write_attrs' root attributes, pwrite for the tensors' bytes, their CRC-32s from a second
// thread), fsync, rename, fsync of the directory. Returns the file's size. Throws UserError
// naming the file; `path` is then unchanged.
int64_t write_atomically(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::function<void(hid_t)>& write_attrs);
// The model's description: format, layers, input shape, classes, format version.
void write_model_attrs(hid_t f, const Model& model, const char* format);

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

// int8 files (int8_format.cpp): "/int8/fc1/weight" for the product "fc1.weight"; the root
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
