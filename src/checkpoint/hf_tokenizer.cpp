#include "checkpoint/hf_tokenizer.h"

#include <openssl/evp.h>

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
#include "strata/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr const char* kShaPrefix = "tokenizer_sha256_";

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: SHA-256 unavailable");
  std::vector<char> buf(1 << 20);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
    EVP_DigestUpdate(ctx.get(), buf.data(), size_t(in.gcount()));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

// The vocabulary's two files, under the names the model file records: {vocab, merges}.
std::pair<std::string, std::string> vocab_files(const GptFileAttrs& a, const std::string& source) {
  if (a.tokenizer_sha256.count("encoder.json") && a.tokenizer_sha256.count("vocab.bpe"))
    return {"encoder.json", "vocab.bpe"};
  if (a.tokenizer_sha256.count("vocab.json") && a.tokenizer_sha256.count("merges.txt"))
    return {"vocab.json", "merges.txt"};
  fail_input("{}: tokenizer = \"gpt2\" but no root attributes {}encoder.json + {}vocab.bpe (or "
             "vocab.json + merges.txt) record its vocabulary", source, kShaPrefix, kShaPrefix);
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
  read_str_attr(f.get(), "tokenizer", &a.tokenizer);
  read_str_attr(f.get(), "tokenizer_vocab", &a.tokenizer_vocab);
  std::vector<std::string> names;
  auto visit = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
  };
  H5_CHECK(H5Aiterate2(f.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, visit, &names));
  for (const std::string& n : names)
    if (n.rfind(kShaPrefix, 0) == 0) {
      std::string sha;
      if (!read_str_attr(f.get(), n.c_str(), &sha))
        throw UserError(kExitBadCheckpoint, fmt::format("{}: root attribute {} is not a string", h5_path, n));
      a.tokenizer_sha256[n.substr(std::string(kShaPrefix).size())] = sha;
    }
  return a;
}

void check_tokenizer_files(const GptFileAttrs& a, const std::string& source) {
  const auto [vocab, merges] = vocab_files(a, source);
  for (const std::string& name : {vocab, merges}) {
    const std::string path = (fs::path(a.tokenizer_vocab) / name).string();
    const std::string sha = file_sha256(path);
    if (sha.empty())
      fail_input("{}: cannot read the tokenizer's {} (root attribute tokenizer_vocab of {})", path,
                 name, source);
    if (sha != a.tokenizer_sha256.at(name))
      fail_input("{}: SHA-256 {} is not the {} recorded in {} (the vocabulary changed since)",
                 path, sha, a.tokenizer_sha256.at(name), source);
  }
}

void write_tokenizer_files(const GptFileAttrs& a, const std::string& dir, int64_t context) {
  const auto [vocab, merges] = vocab_files(a, dir);
  for (const auto& [from, to] : {std::pair{vocab, "vocab.json"}, std::pair{merges, "merges.txt"}}) {
    std::ifstream in(fs::path(a.tokenizer_vocab) / from, std::ios::binary);
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
