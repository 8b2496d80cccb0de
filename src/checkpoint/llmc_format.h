// llm.c's GPT-2 model file (github.com/karpathy/llm.c, train_gpt2.py write_model, read by
// train_gpt2.c / .cu gpt2_build_from_checkpoint): 256 little-endian int32 (magic 20240326,
// version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, padded V; the rest 0), then the tensors in
// strata's (nn.Linear's) layout, each stacked over the L blocks: wte (Vp x C), wpe (maxT x C),
// ln1w, ln1b (L x C), qkvw (L x 3C x C), qkvb (L x 3C), attprojw (L x C x C), attprojb, ln2w,
// ln2b (L x C), fcw (L x 4C x C), fcb (L x 4C), fcprojw (L x C x 4C), fcprojb (L x C), lnfw,
// lnfb (C). Rows V..Vp of wte are zero.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint/gpt2_layout.h"

namespace strata {

inline constexpr int32_t kLlmcModelMagic = 20240326;

// Writes `w` (the whole model `d`) as an llm.c model file, atomically; dtype "F32" (version 3)
// or "BF16" (version 5). The vocabulary is padded to a multiple of 128 with zero rows.
void export_llmc(const GptDims& d, const GptWeights& w, const std::string& path,
                 const std::string& dtype);

// import_gpt2's llm.c half: header and size checked against the model `dims`.
GptWeights import_llmc(const std::string& path, const GptDims& dims);

}  // namespace strata
