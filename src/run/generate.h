// `strata generate`: text sampled from a trained GPT (a parameter file or checkpoint).
#pragma once
#include <cstdint>
#include <string>

namespace strata {

struct GenerateOptions {
  std::string checkpoint;   // model.h5 or a ckpt-*.h5
  std::string prompt;       // text, encoded with the model's tokenizer
  std::string vocab;        // GPT-2's vocabulary directory when the model names none or it moved
  int tokens = 200;         // to generate
  double temperature = 1.0; // 0 = always the most likely token
  int top_k = 0;            // sample among the k most likely only (0 = all)
  uint64_t seed = 0;        // the same seed, prompt and model give the same text
  std::string device = "cpu";
  int threads = 1;
};

// The tokenizer is the one the model records (its tokenizer attributes, copied from the
// training data: data/tokenizer_identity.h): bytes, or GPT-2's BPE from the recorded
// vocabulary directory (or o.vocab), verified by the files' SHA-256. A model that records none
// is bytes, or GPT-2's from o.vocab if given. GPT-2: an empty prompt starts from <|endoftext|>,
// and only ids of the vocabulary are sampled (never a padded row of a larger output layer).
// Prints the prompt and then each sampled token's bytes as it comes (stdout), returns kExitOk.
// Throws UserError for a file that is not a language model, a tokenizer that does not fit
// it or cannot be found, or a bad option.
int run_generate(const GenerateOptions& o);

}  // namespace strata
