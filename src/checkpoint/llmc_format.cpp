#include "checkpoint/llmc_format.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "base/files.h"
#include "checkpoint/safetensors.h"
#include "strata/error.h"

namespace strata {
namespace {

[[noreturn]] void bad(const std::string& msg) { throw UserError(kExitBadCheckpoint, msg); }

int64_t padded_vocab(int64_t V) { return (V + 127) / 128 * 128; }

// llm.c's sixteen tensors, in file order: each the strata tensor of every block (or one), its
// per-block shape, and whether it is the token table.
struct Group {
  std::string suffix;  // strata name after "blockN." ("" for a tensor outside the blocks)
  std::string whole;   // the tensor outside the blocks
  Shape shape;         // one block's (the token table's: Vp x C)
};
std::vector<Group> groups(const GptDims& d, int64_t Vp) {
  const int64_t C = d.C;
  return {{"", "embedding1.wte", {Vp, C}},          {"", "embedding1.wpe", {d.T, C}},
          {"ln_1.weight", "", {C}},                 {"ln_1.bias", "", {C}},
          {"attn.c_attn.weight", "", {3 * C, C}},   {"attn.c_attn.bias", "", {3 * C}},
          {"attn.c_proj.weight", "", {C, C}},       {"attn.c_proj.bias", "", {C}},
          {"ln_2.weight", "", {C}},                 {"ln_2.bias", "", {C}},
          {"mlp.c_fc.weight", "", {4 * C, C}},      {"mlp.c_fc.bias", "", {4 * C}},
          {"mlp.c_proj.weight", "", {C, 4 * C}},    {"mlp.c_proj.bias", "", {C}},
          {"", "layernorm1.weight", {C}},           {"", "layernorm1.bias", {C}}};
}

std::string block_name(int64_t l, const std::string& suffix) {
  return fmt::format("block{}.{}", l + 1, suffix);
}

}  // namespace

void export_llmc(const GptDims& d, const GptWeights& w, const std::string& path,
                 const std::string& dtype) {
  const int64_t Vp = padded_vocab(d.V);
  int32_t header[256] = {};
  header[0] = kLlmcModelMagic;
  header[1] = dtype == "BF16" ? 5 : 3;
  header[2] = int32_t(d.T);
  header[3] = int32_t(d.V);
  header[4] = int32_t(d.L);
  header[5] = int32_t(d.NH);
  header[6] = int32_t(d.C);
  header[7] = int32_t(Vp);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail_input("--out {}: cannot create the file (is its directory writable?)", path);
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    for (const Group& g : groups(d, Vp)) {
      if (!g.whole.empty()) {
        std::vector<float> v = w.at(g.whole);
        if (g.whole == "embedding1.wte") v.resize(size_t(d.V * d.C)), v.resize(size_t(Vp * d.C), 0.f);
        const std::string bytes = encode_floats(v.data(), int64_t(v.size()), dtype);
        out.write(bytes.data(), std::streamsize(bytes.size()));
        continue;
      }
      for (int64_t l = 0; l < d.L; ++l) {
        const std::vector<float>& v = w.at(block_name(l, g.suffix));
        const std::string bytes = encode_floats(v.data(), int64_t(v.size()), dtype);
        out.write(bytes.data(), std::streamsize(bytes.size()));
      }
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail_input("--out {}: writing failed (disk full?); nothing was left under that name", path);
    }
  }
  publish_file(tmp, path);
}

GptWeights import_llmc(const std::string& path, const GptDims& dims) {
  struct stat sb{};
  if (::stat(path.c_str(), &sb) != 0) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  std::ifstream in(path, std::ios::binary);
  int32_t h[256] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof h))
    bad(fmt::format("{}: {} bytes: shorter than llm.c's 1024-byte header", path, sb.st_size));
  if (h[0] != kLlmcModelMagic)
    bad(fmt::format("{}: magic {} is not llm.c's model magic {}", path, h[0], kLlmcModelMagic));
  if (h[1] != 3 && h[1] != 5)
    bad(fmt::format("{}: version {} is not one strata reads (3: fp32, 5: bf16, padded vocabulary)",
                    path, h[1]));
  const std::string dtype = h[1] == 5 ? "BF16" : "F32";
  const int64_t V = h[3], Vp = h[7];
  // The header against the model: the first field that differs is named.
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"maxT (model.context)", {h[2], dims.T}}, {"L (model.layers)", {h[4], dims.L}},
      {"NH (model.heads)", {h[5], dims.NH}},    {"C (model.dim)", {h[6], dims.C}}};
  for (const auto& [name, v] : fields)
    if (v.first != v.second)
      bad(fmt::format("{}: header {} = {}; the model has {}", path, name, v.first, v.second));
  if (V < 1 || Vp < V)
    bad(fmt::format("{}: header V = {} and padded V = {} do not make a vocabulary", path, V, Vp));
  check_vocab(V, dims, path, "header V");
  int64_t elems = 0;
  for (const Group& g : groups(dims, Vp)) elems += numel(g.shape) * (g.whole.empty() ? dims.L : 1);
  const int64_t want = 1024 + elems * (dtype == "BF16" ? 2 : 4);
  if (int64_t(sb.st_size) != want)
    bad(fmt::format("{}: {} bytes; its header (version {}, maxT {}, Vp {}, L {}, C {}) needs {}",
                    path, sb.st_size, h[1], h[2], Vp, h[4], h[6], want));
  if (!dims.gelu_tanh)  // llm.c's blocks always run the tanh GELU
    bad(fmt::format("{}: an llm.c model, trained with the tanh GELU; the model's is {}", path,
                    gelu_name(false)));
  GptWeights w;
  auto next = [&](const Shape& shape, const std::string& name) {
    std::string bytes(size_t(numel(shape) * (dtype == "BF16" ? 2 : 4)), '\0');
    if (!in.read(bytes.data(), std::streamsize(bytes.size())))
      bad(fmt::format("{}: cannot read {} (truncated?)", path, name));
    return decode_floats(bytes, dtype, path);
  };
  for (const Group& g : groups(dims, Vp)) {
    if (!g.whole.empty()) {
      std::vector<float> v = next(g.shape, g.whole);
      if (g.whole == "embedding1.wte") v.resize(size_t(V * dims.C)), v.resize(size_t(dims.Vp * dims.C), 0.f);
      w[g.whole] = std::move(v);
      continue;
    }
    for (int64_t l = 0; l < dims.L; ++l) w[block_name(l, g.suffix)] = next(g.shape, block_name(l, g.suffix));
  }
  return w;
}

}  // namespace strata
