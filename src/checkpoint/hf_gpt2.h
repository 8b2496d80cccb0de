// Hugging Face's GPT-2 (transformers' GPT2LMHeadModel): a directory of model.safetensors (or
// model.safetensors.index.json and model-0000k-of-0000n.safetensors shards), config.json and,
// when the model has GPT-2's tokenizer, vocab.json, merges.txt, tokenizer_config.json and
// special_tokens_map.json. Tensor names are the hub's gpt2 checkpoint's (wte.weight, h.N.*,
// ln_f.*; no "transformer." prefix, no lm_head: it is tied to wte).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "checkpoint/gpt2_layout.h"
#include "checkpoint/hf_tokenizer.h"

namespace strata {

struct HfExport {
  std::string dtype = "F32";               // F32 | BF16
  int64_t max_shard_bytes = 5000000000;    // one file up to this many tensor bytes, else shards
};
// Writes `w` (strata's names and layout, the whole model `d`) into `dir` (created if needed):
// the safetensors file(s), config.json, and the tokenizer's files when `attrs` names GPT-2's
// (each checked against its recorded SHA-256 first). `source`: the model file, for messages.
void export_hf(const GptDims& d, const GptWeights& w, const GptFileAttrs& attrs,
               const std::string& dir, const HfExport& opt, const std::string& source);

// import_gpt2's Hugging Face half: a directory or a .safetensors file.
GptWeights import_hf(const std::string& path, const GptDims& dims);

}  // namespace strata
