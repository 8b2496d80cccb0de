// Recording and finding a token file's tokenizer (tokenizer_identity.h).
#include "data/tokenizer_identity.h"

#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "base/hdf5_util.h"
#include "data/prepare.h"
#include "strata/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr const char* kShaPrefix = "tokenizer_sha256_";

bool is_tokenizer_attr(const std::string& name) {
  return name == "tokenizer" || name == "tokenizer_vocab" || name.rfind(kShaPrefix, 0) == 0;
}

}  // namespace

TokenizerAttrs gpt2_tokenizer_attrs(const Gpt2Tokenizer& t, const std::string& dir) {
  TokenizerAttrs a;
  a["tokenizer"] = "gpt2";
  a["tokenizer_vocab"] = fs::absolute(dir).lexically_normal().string();
  for (const std::string& f : t.files())
    a[kShaPrefix + fs::path(f).filename().string()] = sha256_file(f);
  return a;
}

std::string tokenizer_name(const TokenizerAttrs& attrs) {
  auto it = attrs.find("tokenizer");
  return it == attrs.end() ? "bytes" : it->second;
}

void write_tokenizer_attrs(hid_t obj, const TokenizerAttrs& attrs) {
  for (const auto& [name, value] : attrs) write_str_attr(obj, name, value);
}

TokenizerAttrs read_tokenizer_attrs(hid_t obj) {
  std::vector<std::string> names;
  H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
              [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
                static_cast<std::vector<std::string>*>(data)->push_back(name);
                return 0;
              },
              &names);
  TokenizerAttrs a;
  for (const std::string& n : names) {
    std::string v;
    if (is_tokenizer_attr(n) && read_str_attr(obj, n.c_str(), &v)) a[n] = v;
  }
  return a;
}

void check_recorded_files(const TokenizerAttrs& attrs, const std::string& dir, const std::string& file,
                          const std::string& hint) {
  const std::string then = hint.empty() ? "" : "; " + hint;
  for (const auto& [name, sha] : attrs) {
    if (name.rfind(kShaPrefix, 0) != 0) continue;
    const std::string path = (fs::path(dir) / name.substr(std::string(kShaPrefix).size())).string();
    std::error_code ec;
    if (!fs::exists(path, ec))
      fail_input("{}: does not exist, but {} was made with it ({}){}", path, file, name, then);
    const std::string got = sha256_file(path);
    if (got != sha)
      fail_input("{}: SHA-256 {} is not the {} recorded in {} ({}): a different vocabulary{}", path, got,
                 sha, file, name, then);
  }
}

Gpt2Tokenizer load_recorded_gpt2(const TokenizerAttrs& attrs, const std::string& vocab_dir,
                                 const std::string& file) {
  std::string dir = vocab_dir;
  if (dir.empty()) {
    auto it = attrs.find("tokenizer_vocab");
    if (it == attrs.end() || it->second.empty())
      fail_input("{}: records tokenizer gpt2 but not its vocabulary directory; name it with --vocab DIR", file);
    dir = it->second;
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      fail_input("{}: its tokenizer's vocabulary {} is not there (moved?); name it with --vocab DIR", file, dir);
  }
  Gpt2Tokenizer t = Gpt2Tokenizer::load(dir);
  check_recorded_files(attrs, dir, file, "name the right directory with --vocab");
  return t;
}

}  // namespace strata
