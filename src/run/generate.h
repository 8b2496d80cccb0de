// `strata generate`: text sampled from a trained GPT (a parameter file or checkpoint).
#pragma once
#include <cstdint>
#include <string>

namespace strata {

struct GenerateOptions {
  std::string checkpoint;   // model.h5 or a ckpt-*.h5
  std::string prompt;       // bytes (the byte-level tokenizer of `strata prepare text`)
  int tokens = 200;         // to generate
  double temperature = 1.0; // 0 = always the most likely token
  int top_k = 0;            // sample among the k most likely only (0 = all)
  uint64_t seed = 0;        // the same seed, prompt and model give the same text
  std::string device = "cpu";
  int threads = 1;
};

// Prints the prompt and then each sampled token as it comes (stdout), returns kExitOk. Throws
// UserError for a file that is not a language model, or a bad option.
int run_generate(const GenerateOptions& o);

}  // namespace strata
