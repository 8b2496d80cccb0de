// Reading GPT-2's vocabulary files (gpt2_tokenizer.h): the JSON object of token -> id and the
// merge list, both spelled in GPT-2's printable alphabet for bytes.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "base/json.h"
#include "data/gpt2_tokenizer.h"
#include "strata/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// GPT-2's bytes_to_unicode(): the printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand
// for themselves; the other 68 bytes, in increasing order, for U+0100, U+0101, ...
// Returns the byte of each code point, -1 for one outside the alphabet.
std::vector<int> byte_of_code_point() {
  std::vector<int> byte(256 + 68, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    byte[size_t(printable ? b : next++)] = b;
  }
  return byte;
}

// s for an error message: control bytes as \xNN, at most 60 bytes.
std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60)) out += c < 0x20 || c == 0x7F ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  return s.size() > 60 ? out + "..." : out;
}

// Decodes one UTF-8 code point of s at i (advancing i); -1 for invalid UTF-8.
int64_t next_code_point(const std::string& s, size_t& i) {
  const unsigned char c = (unsigned char)s[i++];
  if (c < 0x80) return c;
  const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i + size_t(len - 1) > s.size()) return -1;
  uint32_t cp = c & (0x3F >> (len - 1));
  for (int k = 1; k < len; ++k) {
    const unsigned char d = (unsigned char)s[i++];
    if ((d & 0xC0) != 0x80) return -1;
    cp = cp << 6 | (d & 0x3F);
  }
  return cp;
}

}  // namespace

// Builds a Gpt2Tokenizer from the two files (a friend of it).
struct Gpt2VocabReader {
  Gpt2Tokenizer t;
  std::vector<int> byte_of = byte_of_code_point();
  std::unordered_map<std::string, int32_t> id_of;  // by the token's bytes

  // GPT-2's spelling -> the bytes it stands for; "" if a character is outside the alphabet.
  std::string to_bytes(const std::string& spelled, std::string* bad) const {
    std::string out;
    for (size_t i = 0; i < spelled.size();) {
      const int64_t cp = next_code_point(spelled, i);
      if (cp < 0 || size_t(cp) >= byte_of.size() || byte_of[size_t(cp)] < 0) {
        *bad = cp < 0 ? "invalid UTF-8" : fmt::format("U+{:04X}", cp);
        return "";
      }
      out += char(byte_of[size_t(cp)]);
    }
    return out;
  }

  // encoder.json / vocab.json: one JSON object {"token": id, ...}; a fault names the line and
  // column of its token.
  void read_vocab(const std::string& path) {
    const std::string text = read_whole_file(path);
    const JsonValue json = parse_json(text, path);
    auto fail_at = [&](size_t offset, const std::string& what) {
      const TextPosition p = json_position(text, offset);
      fail_input("{}: line {}, column {}: {}", path, p.line, p.column, what);
    };
    if (!json.is_object()) fail_at(json.offset, "expected '{' (a JSON object of token -> id)");
    if (json.members.empty()) fail_at(json.offset, "the object is empty; expected token -> id members");
    std::vector<const std::pair<std::string, JsonValue>*> member_of_id;  // null: no token has it
    for (const auto& member : json.members) {
      const auto& [key, value] = member;
      auto at = [&](const std::string& what) { fail_at(value.key_offset, fmt::format("token \"{}\" {}", shown(key), what)); };
      if (!value.is_int() || value.int_value < 0) at("has an id that is not a non-negative integer");
      if (value.int_value > (int64_t(1) << 24)) at("has a token id over 2^24");
      const size_t id = size_t(value.int_value);
      std::string bad;
      const std::string bytes = to_bytes(key, &bad);
      if (bytes.empty()) at(key.empty() ? "is empty" : fmt::format("has {}, outside GPT-2's byte alphabet", bad));
      if (id >= t.token_bytes_.size()) {
        t.token_bytes_.resize(id + 1);
        member_of_id.resize(id + 1);
      }
      if (const auto* first = member_of_id[id])
        at(fmt::format("has id {}, which the token \"{}\" already has (line {})", id, shown(first->first),
                       json_position(text, first->second.key_offset).line));
      if (!id_of.emplace(bytes, int32_t(id)).second)
        at(fmt::format("appears twice (ids {} and {})", id_of[bytes], id));
      t.token_bytes_[id] = bytes;
      member_of_id[id] = &member;
    }
    for (size_t id = 0; id < member_of_id.size(); ++id)
      if (!member_of_id[id])
        fail_input("{}: no token has id {} (of 0..{}); ids must be 0..n-1", path, id, member_of_id.size() - 1);
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, char(b)));
      if (it == id_of.end()) fail_input("{}: has no token for the byte 0x{:02x}", path, b);
      t.byte_token_[b] = it->second;
    }
  }

  // One merge "A B" per line after an optional "#version" line; rank = order.
  void read_merges(const std::string& path, const std::string& vocab_path) {
    const std::string text = read_whole_file(path);
    std::vector<std::array<int32_t, 3>> merges;  // left, right, merged
    std::unordered_map<uint64_t, size_t> line_of_pair;
    size_t line = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string l = text.substr(pos, end - pos);
      pos = end + 1;
      ++line;
      if (!l.empty() && l.back() == '\r') l.pop_back();
      if ((line == 1 && l.rfind("#version", 0) == 0) || l.empty()) continue;
      const size_t sp = l.find(' ');
      if (sp == std::string::npos || sp == 0 || l.find(' ', sp + 1) != std::string::npos ||
          sp + 1 == l.size())
        fail_input("{}: line {}: \"{}\" is not a merge (two tokens separated by one space)", path, line, shown(l));
      int32_t ids[3];
      const std::string parts[3] = {l.substr(0, sp), l.substr(sp + 1), l.substr(0, sp) + l.substr(sp + 1)};
      for (int k = 0; k < 3; ++k) {
        std::string bad;
        const std::string bytes = to_bytes(parts[k], &bad);
        auto it = bytes.empty() ? id_of.end() : id_of.find(bytes);
        if (it == id_of.end())
          fail_input("{}: line {}: the merge \"{}\" names {} \"{}\", which is not in {}", path,
                     line, shown(l), k < 2 ? "the token" : "the merged token", shown(parts[k]), vocab_path);
        ids[k] = it->second;
      }
      const uint64_t pair = uint64_t(uint32_t(ids[0])) << 32 | uint32_t(ids[1]);
      if (auto [it, fresh] = line_of_pair.emplace(pair, line); !fresh)
        fail_input("{}: line {}: the merge \"{}\" repeats line {}", path, line, shown(l), it->second);
      merges.push_back({ids[0], ids[1], ids[2]});
    }
    if (merges.empty()) fail_input("{}: has no merges", path);
    build_table(merges);
  }

  void build_table(const std::vector<std::array<int32_t, 3>>& merges) {
    size_t cap = 1;
    while (cap < 2 * merges.size()) cap *= 2;
    t.merges_.assign(cap, {});
    // The rank of the first merge that makes each token (single bytes: -1).
    std::vector<int64_t> made_at(t.token_bytes_.size(), INT64_MAX);
    for (int b = 0; b < 256; ++b) made_at[size_t(t.byte_token_[b])] = -1;
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto& [left, right, merged] = merges[r];
      if (made_at[size_t(left)] >= int64_t(r) || made_at[size_t(right)] >= int64_t(r))
        t.ranks_ordered_ = false;
      made_at[size_t(merged)] = std::min<int64_t>(made_at[size_t(merged)], int64_t(r));
      const uint64_t pair = uint64_t(uint32_t(left)) << 32 | uint32_t(right);
      size_t slot = size_t((pair * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
      while (t.merges_[slot].pair != ~uint64_t(0)) slot = (slot + 1) & (cap - 1);
      t.merges_[slot] = {pair, int32_t(r), merged};
    }
  }
};

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_input("{}: {}; --vocab names the directory of encoder.json and vocab.bpe (or "
               "vocab.json and merges.txt)", dir, fs::exists(dir, ec) ? "is not a directory" : "does not exist");
  const fs::path d(dir);
  std::string vocab = (d / "encoder.json").string(), merges = (d / "vocab.bpe").string();
  if (!fs::exists(vocab, ec) && !fs::exists(merges, ec) && fs::exists(d / "vocab.json", ec)) {
    vocab = (d / "vocab.json").string();
    merges = (d / "merges.txt").string();
  }
  Gpt2VocabReader r;
  r.read_vocab(vocab);
  r.read_merges(merges, vocab);
  r.t.files_ = {vocab, merges};
  return std::move(r.t);
}

}  // namespace strata
