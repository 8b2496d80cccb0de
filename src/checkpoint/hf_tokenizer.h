// What a strata model file records beside its tensors that an export needs, and the tokenizer
// files a Hugging Face export carries (GPT2Tokenizer's: vocab.json, merges.txt,
// tokenizer_config.json, special_tokens_map.json).
#pragma once
#include <cstdint>
#include <string>

#include "data/tokenizer_identity.h"

namespace strata {

// Root attributes of a parameter file or checkpoint: vocab_size (the real vocabulary; 0 when
// absent: every row of the token table), tokenizer ("gpt2"; absent or "bytes": strata's byte
// tokens), tokenizer_vocab (the vocabulary's directory) and tokenizer_sha256_<name> for each
// of its files (encoder.json + vocab.bpe, or vocab.json + merges.txt).
struct GptFileAttrs {
  int64_t vocab_size = 0;
  TokenizerAttrs tokenizer;  // data/tokenizer_identity.h
};
// Throws UserError(kExitBadCheckpoint) naming the file for a vocab_size of the wrong type.
GptFileAttrs read_gpt_attrs(const std::string& h5_path);

// GPT-2's vocabulary files as `attrs` records them, each present in tokenizer_vocab with its
// recorded SHA-256; throws UserError(kExitBadInput) naming the file (and `source`) otherwise.
void check_tokenizer_files(const GptFileAttrs& attrs, const std::string& source);
// Copies them into `dir` as vocab.json and merges.txt (encoder.json and vocab.bpe are the
// same files under OpenAI's names), byte for byte, with GPT2Tokenizer's tokenizer_config.json
// (model_max_length = `context`) and special_tokens_map.json (<|endoftext|>).
void write_tokenizer_files(const GptFileAttrs& attrs, const std::string& dir, int64_t context);

}  // namespace strata
