#include "checkpoint/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "data/data.h"
#include "data/tokenizer_identity.h"
#include "strata/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// The vocabulary's two files, under the names the model file records: {vocab, merges}.
std::pair<std::string, std::string> vocab_files(const GptFileAttrs& a, const std::string& source) {
  auto recorded = [&](const char* name) { return a.tokenizer.count(std::string("tokenizer_sha256_") + name) > 0; };
  if (recorded("encoder.json") && recorded("vocab.bpe")) return {"encoder.json", "vocab.bpe"};
  if (recorded("vocab.json") && recorded("merges.txt")) return {"vocab.json", "merges.txt"};
  fail_input("{}: tokenizer = \"gpt2\" but no root attributes tokenizer_sha256_encoder.json + "
             "tokenizer_sha256_vocab.bpe (or vocab.json + merges.txt) record its vocabulary", source);
}

// The directory of the vocabulary's files (root attribute tokenizer_vocab).
std::string vocab_dir(const GptFileAttrs& a, const std::string& source) {
  auto it = a.tokenizer.find("tokenizer_vocab");
  if (it == a.tokenizer.end() || it->second.empty())
    fail_input("{}: tokenizer = \"gpt2\" but no root attribute tokenizer_vocab names its vocabulary", source);
  return it->second;
}

}  // namespace

GptFileAttrs read_gpt_attrs(const std::string& h5_path) {
  GptFileAttrs a;
  std::lock_guard lock(hdf5_mutex());
  h5_quiet();
  H5Id f(H5Fopen(h5_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) throw UserError(kExitBadCheckpoint, fmt::format("{}: cannot open it as HDF5", h5_path));
  std::vector<int64_t> v;
  if (H5Aexists(f.get(), "vocab_size") > 0 && (!read_int_attr(f.get(), "vocab_size", &v) || v.size() != 1 || v[0] < 1))
    throw UserError(kExitBadCheckpoint, fmt::format("{}: root attribute vocab_size is not a positive integer", h5_path));
  if (!v.empty()) a.vocab_size = v[0];
  a.tokenizer = read_tokenizer_attrs(f.get());
  return a;
}

void check_tokenizer_files(const GptFileAttrs& a, const std::string& source) {
  vocab_files(a, source);
  check_recorded_files(a.tokenizer, vocab_dir(a, source), source, "");
}

void write_tokenizer_files(const GptFileAttrs& a, const std::string& dir, int64_t context) {
  const auto [vocab, merges] = vocab_files(a, dir);
  for (const auto& [from, to] : {std::pair{vocab, "vocab.json"}, std::pair{merges, "merges.txt"}}) {
    std::ifstream in(fs::path(vocab_dir(a, dir)) / from, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    publish_text_file((fs::path(dir) / to).string(), bytes.str());
  }
  const char* eot = "\"<|endoftext|>\"";
  publish_text_file((fs::path(dir) / "special_tokens_map.json").string(),
                    fmt::format("{{\n  \"bos_token\": {0},\n  \"eos_token\": {0},\n  \"unk_token\": {0}\n}}\n", eot));
  publish_text_file((fs::path(dir) / "tokenizer_config.json").string(),
                    fmt::format("{{\n  \"add_prefix_space\": false,\n  \"bos_token\": {0},\n  \"eos_token\": {0},\n"
                                "  \"unk_token\": {0},\n  \"model_max_length\": {1},\n"
                                "  \"tokenizer_class\": \"GPT2Tokenizer\"\n}}\n", eot, context));
}

}  // namespace strata
