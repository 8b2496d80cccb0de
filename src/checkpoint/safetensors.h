// Hugging Face's safetensors files (github.com/huggingface/safetensors, "Format"): an unsigned
// little-endian u64 N, N bytes of a JSON header {"NAME": {"dtype", "shape", "data_offsets":
// [BEGIN, END]}, ..., "__metadata__": {string: string}} padded with spaces, then the byte buffer
// the offsets index: little-endian, row-major, every byte belonging to exactly one tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/tensor.h"

namespace strata {

struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ... as the format spells it
  Shape shape;
  std::string bytes;  // little-endian data, numel(shape) x dtype size
};

// Writes `tensors` in the given order (the header lists them in that order too, contiguous from
// offset 0) and `metadata` under "__metadata__", atomically (files.h: publish_file). The header
// is padded with spaces to a multiple of 8 bytes so the buffer starts 8-byte aligned.
// Throws UserError(kExitBadInput) naming `path` when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Reads a safetensors file and checks every rule of the format: the header length within the
// file (and at most 100 MB), UTF-8 JSON starting with '{' without duplicate keys, each entry a
// known dtype, a shape of non-negative integers and [BEGIN, END] offsets whose size is the
// shape's, the entries covering the buffer in order with no gap or overlap, up to the file's
// end; __metadata__ strings only. Tensors come back in offset order. A missing file is
// UserError(kExitBadInput); anything else wrong is UserError(kExitBadCheckpoint) naming the
// file, and the tensor or byte offset at fault.
struct SafeTensorsFile {
  std::vector<SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};
SafeTensorsFile read_safetensors(const std::string& path);

// Bytes per element of a dtype the format defines (0 for an unknown name, or for the sub-byte
// types this reader does not take).
int64_t safetensors_dtype_size(const std::string& dtype);

// fp32 values as the bytes of a F32 or BF16 tensor (bf16: rounded to nearest, ties to even),
// and back: F32, BF16 or F16 bytes as fp32 (exactly). decode_floats throws UserError(
// kExitBadCheckpoint) "WHERE: dtype D is not a floating-point type strata reads".
std::string encode_floats(const float* p, int64_t n, const std::string& dtype);
std::vector<float> decode_floats(const std::string& bytes, const std::string& dtype,
                                 const std::string& where);
uint16_t bf16_round(float x);  // the bf16 nearest x (ties to even); NaN stays NaN

}  // namespace strata
