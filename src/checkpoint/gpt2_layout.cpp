#include "checkpoint/gpt2_layout.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/llmc_format.h"
#include "strata/error.h"

namespace strata {

GptDims gpt_dims(const ModelSpec& spec, const Shape& input_shape, int classes, int64_t vocab,
                 const std::string& where) {
  using K = LayerSpec::Kind;
  GptDims d;
  size_t i = 0;
  const bool head = spec.size() >= 3 && spec[0].kind == K::kEmbedding &&
                    spec[spec.size() - 2].kind == K::kLayerNorm && spec.back().kind == K::kLmHead;
  if (head) {
    ++i;
    if (spec[i].kind == K::kDropout) d.dropout = spec[i++].p;
    for (; i + 2 < spec.size() && spec[i].kind == K::kBlock; ++i) {
      if (d.L > 0 && spec[i].size != d.NH)
        fail_input("{}: not a GPT-2 model: its blocks have different head counts", where);
      if (d.L > 0 && spec[i].gelu_tanh != d.gelu_tanh)
        fail_input("{}: not a GPT-2 model: its blocks have different GELUs", where);
      d.NH = spec[i].size;
      d.gelu_tanh = spec[i].gelu_tanh;
      ++d.L;
    }
  }
  if (!head || i + 2 != spec.size() || d.L == 0 || input_shape.size() != 1)
    fail_input("{}: not a GPT-2 model (model.type = \"gpt\": embedding, blocks, layernorm, "
               "lmhead); only those export", where);
  d.C = spec[0].size;
  d.T = input_shape[0];
  d.Vp = classes;
  d.V = vocab > 0 ? vocab : classes;
  if (d.V > d.Vp)
    fail_input("{}: vocab_size {} is larger than the token table's {} rows", where, d.V, d.Vp);
  return d;
}

std::string gelu_name(bool tanh) {
  return tanh ? "tanh (model.gelu = \"tanh\")" : "erf (model.gelu = \"erf\")";
}

std::vector<GptTensor> gpt_tensors(const GptDims& d) {
  const int64_t C = d.C;
  std::vector<GptTensor> t = {{"embedding1.wte", "wte.weight", {d.V, C}, false},
                              {"embedding1.wpe", "wpe.weight", {d.T, C}, false}};
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string s = fmt::format("block{}.", l + 1), h = fmt::format("h.{}.", l);
    auto add = [&](const char* name, Shape shape, bool conv1d = false) {
      t.push_back({s + name, h + name, std::move(shape), conv1d});
    };
    add("ln_1.weight", {C});
    add("ln_1.bias", {C});
    add("attn.c_attn.weight", {3 * C, C}, true);
    add("attn.c_attn.bias", {3 * C});
    add("attn.c_proj.weight", {C, C}, true);
    add("attn.c_proj.bias", {C});
    add("ln_2.weight", {C});
    add("ln_2.bias", {C});
    add("mlp.c_fc.weight", {4 * C, C}, true);
    add("mlp.c_fc.bias", {4 * C});
    add("mlp.c_proj.weight", {C, 4 * C}, true);
    add("mlp.c_proj.bias", {C});
  }
  t.push_back({"layernorm1.weight", "ln_f.weight", {C}, false});
  t.push_back({"layernorm1.bias", "ln_f.bias", {C}, false});
  return t;
}

Shape hf_shape(const GptTensor& t) { return t.conv1d ? Shape{t.shape[1], t.shape[0]} : t.shape; }

std::vector<float> transposed(const float* p, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = p[r * cols + c];
  return out;
}

void check_vocab(int64_t file_v, const GptDims& model, const std::string& where,
                 const std::string& tensor) {
  const int64_t padded = (file_v + 127) / 128 * 128;
  if (file_v == model.Vp || (file_v < model.Vp && padded == model.Vp)) return;
  throw UserError(kExitBadCheckpoint,
                  fmt::format("{}: {} holds a vocabulary of {} tokens; the model's token table "
                              "has {} rows (model.vocab / the data's vocabulary)", where, tensor,
                              file_v, model.Vp));
}

GptWeights import_gpt2(const std::string& path, const GptDims& dims) {
  struct stat sb{};
  if (::stat(path.c_str(), &sb) != 0)
    fail_input("train.init_from: {}: cannot open ({})", path, std::strerror(errno));
  if (S_ISDIR(sb.st_mode) || path.ends_with(".safetensors"))
    return import_hf(path, dims);
  char magic[8] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 8);
  int32_t m = 0;
  std::memcpy(&m, magic, 4);
  if (in.gcount() >= 4 && m == kLlmcModelMagic) return import_llmc(path, dims);
  // strata's own HDF5 files, the likely mistake, are another kind of file (exit 2); other
  // bytes are taken for a damaged llm.c file (exit 4).
  if (in.gcount() == 8 && std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0)
    fail_input("train.init_from: {}: an HDF5 file (strata's parameter files and checkpoints are): "
               "continue a run from it with --resume {}; init_from reads Hugging Face GPT-2 "
               "directories and llm.c model files", path, path);
  throw UserError(kExitBadCheckpoint,
                  fmt::format("train.init_from: {}: neither a Hugging Face GPT-2 directory or "
                              ".safetensors file nor an llm.c model file (its first int32 is {}, "
                              "not llm.c's magic {})", path, in.gcount() >= 4 ? m : -1, kLlmcModelMagic));
}

}  // namespace strata
