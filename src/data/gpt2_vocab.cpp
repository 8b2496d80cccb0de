// Reading GPT-2's vocabulary files (gpt2_tokenizer.h): the JSON object of token -> id and the
// merge list, both spelled in GPT-2's printable alphabet for bytes.
#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

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

std::string read_whole(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_input("{}: does not exist", path);
  if (fs::is_directory(path, ec)) fail_input("{}: is a directory; expected a file", path);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail_input("{}: cannot open ({})", path, std::strerror(errno));
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) data.append(buf, n);
  if (std::ferror(f.get())) fail_input("{}: cannot read ({})", path, std::strerror(errno));
  return data;
}

// Appends the UTF-8 of code point cp.
void put_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | cp >> 6), s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | cp >> 12), s += char(0x80 | (cp >> 6 & 0x3F)), s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | cp >> 18), s += char(0x80 | (cp >> 12 & 0x3F));
    s += char(0x80 | (cp >> 6 & 0x3F)), s += char(0x80 | (cp & 0x3F));
  }
}

// The encoder.json / vocab.json object {"token": id, ...}, read strictly, with the line and
// column of the first fault.
class JsonVocab {
 public:
  JsonVocab(std::string path, std::string text) : path_(std::move(path)), s_(std::move(text)) {}

  // Calls add(token in UTF-8, id, line, column) for each member, in file order.
  template <typename F>
  void parse(F&& add) {
    skip_ws();
    expect('{', "'{' (a JSON object of token -> id)");
    skip_ws();
    if (peek() == '}') fail("the object is empty; expected token -> id members");
    for (;;) {
      skip_ws();
      const size_t line = line_, column = col();
      std::string key = string();
      skip_ws();
      expect(':', "':'");
      skip_ws();
      add(key, id(), line, column);
      skip_ws();
      if (peek() == ',') {
        next();
        continue;
      }
      expect('}', "',' or '}'");
      break;
    }
    skip_ws();
    if (i_ < s_.size()) fail("unexpected text after the JSON object");
  }

  [[noreturn]] void fail(const std::string& what) const {
    fail_input("{}: line {}, column {}: {}", path_, line_, col(), what);
  }

 private:
  int peek() const { return i_ < s_.size() ? (unsigned char)s_[i_] : -1; }
  int next() {
    if (i_ >= s_.size()) fail("unexpected end of file");
    const int c = (unsigned char)s_[i_++];
    if (c == '\n') ++line_, line_start_ = i_;
    return c;
  }
  size_t col() const { return i_ - line_start_ + 1; }
  void skip_ws() {
    while (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r') next();
  }
  void expect(char c, const char* what) {
    if (peek() != (unsigned char)c)
      fail(peek() < 0 ? fmt::format("unexpected end of file; expected {}", what)
                      : fmt::format("expected {}", what));
    next();
  }
  uint32_t hex4() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int c = next();
      const int d = c >= '0' && c <= '9' ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("bad \\u escape; expected 4 hex digits");
      v = v << 4 | uint32_t(d);
    }
    return v;
  }
  std::string string() {
    expect('"', "'\"' (a token in quotes)");
    std::string out;
    for (;;) {
      const int c = next();
      if (c == '"') return out;
      if (c < 0x20) fail("control character in a string; JSON needs it escaped");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      const int e = next();
      switch (e) {
        case '"': case '\\': case '/': out += char(e); break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (next() != '\\' || next() != 'u') fail("lone UTF-16 surrogate in \\u escape");
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad UTF-16 surrogate pair in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("lone UTF-16 surrogate in \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(fmt::format("bad escape '\\{}'", char(e)));
      }
    }
  }
  int64_t id() {
    if (peek() < '0' || peek() > '9') fail("expected a token id (a non-negative integer)");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (next() - '0');
      if (v > (int64_t(1) << 24)) fail("token id over 2^24");
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail("token id is not an integer");
    return v;
  }

  std::string path_, s_;
  size_t i_ = 0, line_ = 1, line_start_ = 0;
};

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

  void read_vocab(const std::string& path) {
    JsonVocab json(path, read_whole(path));
    std::vector<size_t> line_of_id;          // 0: no token has the id (yet)
    std::vector<std::string> spelled_of_id;  // as the file spells it, for messages
    json.parse([&](const std::string& key, int64_t id, size_t line, size_t col) {
      std::string bad;
      const std::string bytes = to_bytes(key, &bad);
      auto at = [&](const std::string& what) {
        fail_input("{}: line {}, column {}: token \"{}\" {}", path, line, col, shown(key), what);
      };
      if (bytes.empty()) at(key.empty() ? "is empty" : fmt::format("has {}, outside GPT-2's byte alphabet", bad));
      if (size_t(id) >= t.token_bytes_.size()) {
        t.token_bytes_.resize(size_t(id) + 1);
        line_of_id.resize(size_t(id) + 1);
        spelled_of_id.resize(size_t(id) + 1);
      }
      if (line_of_id[size_t(id)])
        at(fmt::format("has id {}, which the token \"{}\" already has (line {})", id,
                       spelled_of_id[size_t(id)], line_of_id[size_t(id)]));
      if (!id_of.emplace(bytes, int32_t(id)).second)
        at(fmt::format("appears twice (ids {} and {})", id_of[bytes], id));
      t.token_bytes_[size_t(id)] = bytes;
      spelled_of_id[size_t(id)] = key;
      line_of_id[size_t(id)] = line;
    });
    for (size_t id = 0; id < line_of_id.size(); ++id)
      if (!line_of_id[id])
        fail_input("{}: no token has id {} (of 0..{}); ids must be 0..n-1", path, id, line_of_id.size() - 1);
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, char(b)));
      if (it == id_of.end()) fail_input("{}: has no token for the byte 0x{:02x}", path, b);
      t.byte_token_[b] = it->second;
    }
  }

  // One merge "A B" per line after an optional "#version" line; rank = order.
  void read_merges(const std::string& path, const std::string& vocab_path) {
    const std::string text = read_whole(path);
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
