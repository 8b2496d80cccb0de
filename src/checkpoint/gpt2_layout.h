// GPT-2 as other tools store it: the sizes of a strata GPT model, its tensors under strata's
// names and Hugging Face's, and the import of a Hugging Face or llm.c file into a model's
// parameters (train.init_from). The formats themselves: hf_gpt2.h, llmc_format.h.
//
// strata keeps every weight as nn.Linear does (out x in); Hugging Face's GPT-2 keeps the four
// projections (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as Conv1D weights, in x out:
// the one transpose between the two layouts. llm.c keeps strata's layout.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/model_spec.h"
#include "strata/tensor.h"

namespace strata {

struct GptDims {
  int64_t V = 0;   // the real vocabulary (token ids that occur)
  int64_t Vp = 0;  // rows of strata's token table (V, or V padded for speed)
  int64_t T = 0, L = 0, NH = 0, C = 0;  // context, blocks, heads, width
  float dropout = 0;
  bool gelu_tanh = false;  // the blocks' GELU: GPT-2's tanh form (model.gelu = "tanh"), else erf
};

// The GELU's name in messages: "tanh (model.gelu = \"tanh\")" or the erf one.
std::string gelu_name(bool tanh);

// The GPT-2 that `spec` describes (embedding, optional dropout, blocks, layernorm, lmhead) for
// samples of `input_shape` and `classes` token ids, with `vocab` real tokens (0: all rows).
// Throws UserError(kExitBadInput) "WHERE: not a GPT-2 model ..." for any other model.
GptDims gpt_dims(const ModelSpec& spec, const Shape& input_shape, int classes, int64_t vocab,
                 const std::string& where);

// One tensor under both names. `shape` is strata's (out x in), the token table's with the real
// V rows (the file's); conv1d: Hugging Face stores its transpose.
struct GptTensor {
  std::string strata, hf;
  Shape shape;
  bool conv1d = false;
};
// Every tensor of the model, in Hugging Face's order (wte, wpe, h.0.ln_1.weight ... ln_f.bias).
std::vector<GptTensor> gpt_tensors(const GptDims& d);
// Hugging Face's shape of a tensor (the transpose for conv1d).
Shape hf_shape(const GptTensor& t);
// rows x cols row-major -> cols x rows.
std::vector<float> transposed(const float* p, int64_t rows, int64_t cols);

// The model's tensors by strata name, whole, strata's layout; the token table with Vp rows.
using GptWeights = std::map<std::string, std::vector<float>>;

// The vocabulary a file holds (`file_v` rows of real tokens) against the model's: the same, or
// the model's table is that vocabulary padded to a multiple of 128 (llm.c's and the presets'
// padding). Throws UserError(kExitBadCheckpoint) naming `where` and both sizes.
void check_vocab(int64_t file_v, const GptDims& model, const std::string& where,
                 const std::string& tensor);

// train.init_from: a Hugging Face GPT-2 directory (model.safetensors, or an index and its
// shards), a .safetensors file, or an llm.c model file, read as the model `dims`: every tensor
// present with the model's shape (the first that is not, or is missing, or is extra, named in
// one line), token rows past the file's vocabulary zero. Throws UserError: kExitBadInput for a
// missing path, kExitBadCheckpoint for a file that is damaged or does not fit the model.
GptWeights import_gpt2(const std::string& path, const GptDims& dims);

}  // namespace strata
