#include "base/json.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "strata/error.h"

namespace strata {
namespace {

// Recursive descent over the text; depth is bounded so a hostile file cannot exhaust the stack.
class Reader {
 public:
  Reader(const std::string& t, const std::string& where) : t_(t), where_(where) {}

  JsonValue document() {
    JsonValue v = value(0);
    space();
    if (i_ != t_.size()) fail("text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    const TextPosition p = json_position(t_, i_);
    fail_input("{}: bad JSON at line {}, column {} (byte {}): {}", where_, p.line, p.column, i_, what);
  }
  void space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    space();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(fmt::format("{}expected '{}'", i_ < t_.size() ? "" : "unexpected end; ", c));
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    space();
    if (i_ >= t_.size()) fail("unexpected end");
    JsonValue v;
    const char c = t_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    v.offset = i_;
    if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      v.text = string();
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::kBool;
    } else if (literal("null")) {
      v.kind = JsonValue::Kind::kNull;
    } else {
      v = number();
    }
    return v;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (t_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }

  JsonValue object(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kObject;
    v.offset = i_++;
    if (eat('}')) return v;
    do {
      space();
      if (i_ >= t_.size() || t_[i_] != '"') fail("expected a string key");
      const size_t at = i_;
      std::string key = string();
      expect(':');
      v.members.emplace_back(std::move(key), value(depth + 1));
      v.members.back().second.key_offset = at;
    } while (eat(','));
    expect('}');
    no_duplicate_keys(v);
    return v;
  }

  // The first key (in text order) that repeats an earlier one is an error. An open-addressed
  // table of member indices, not a search per key (quadratic in GPT-2's encoder.json, 50257
  // keys) nor a node per key.
  void no_duplicate_keys(const JsonValue& v) {
    const auto& m = v.members;
    if (m.size() < 2) return;
    size_t cap = 4;
    while (cap < 2 * m.size()) cap *= 2;
    std::vector<uint32_t> slot_of(cap, 0);  // 1 + a member's index; 0: empty
    for (size_t k = 0; k < m.size(); ++k) {
      size_t h = std::hash<std::string_view>{}(m[k].first) & (cap - 1);
      for (; slot_of[h]; h = (h + 1) & (cap - 1))
        if (m[slot_of[h] - 1].first == m[k].first) {
          i_ = m[k].second.key_offset;
          fail(fmt::format("duplicate key \"{}\"", m[k].first));
        }
      slot_of[h] = uint32_t(k + 1);
    }
  }

  JsonValue array(int depth) {
    JsonValue v;
    v.kind = JsonValue::Kind::kArray;
    v.offset = i_++;
    if (eat(']')) return v;
    do v.items.push_back(value(depth + 1));
    while (eat(','));
    expect(']');
    return v;
  }

  JsonValue number() {
    const size_t start = i_;
    bool integer = true;
    if (i_ < t_.size() && t_[i_] == '-') ++i_;
    auto digits = [&] {
      const size_t s = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
      return i_ - s;
    };
    const size_t lead = i_;
    if (digits() == 0) fail("expected a value");
    if (t_[lead] == '0' && i_ - lead > 1) fail("a number with a leading zero");
    if (i_ < t_.size() && t_[i_] == '.') {
      ++i_;
      integer = false;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      integer = false;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (digits() == 0) fail("expected digits in the exponent");
    }
    JsonValue v;
    v.kind = JsonValue::Kind::kNumber;
    v.offset = start;
    if (integer && i_ - start <= 18) {  // fits int64; its double is rounded as strtod's: skip both
      int64_t x = 0;
      for (size_t k = t_[start] == '-' ? start + 1 : start; k < i_; ++k) x = x * 10 + (t_[k] - '0');
      v.int_value = t_[start] == '-' ? -x : x;
      v.integer = true;
      v.number = t_[start] == '-' ? -double(x) : double(x);  // -0 stays -0.0
      return v;
    }
    const std::string s = t_.substr(start, i_ - start);
    v.number = std::strtod(s.c_str(), nullptr);
    if (integer) {
      errno = 0;
      const long long x = std::strtoll(s.c_str(), nullptr, 10);
      v.integer = errno != ERANGE;
      v.int_value = x;
    }
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > t_.size()) fail("a short \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[i_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f') u |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= unsigned(h - 'A' + 10);
      else fail("a bad \\u escape");
    }
    return u;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= t_.size()) fail("an unterminated string");
      const size_t plain = i_;  // a run of characters that stand for themselves, appended at once
      while (i_ < t_.size() && t_[i_] != '"' && t_[i_] != '\\' && static_cast<unsigned char>(t_[i_]) >= 0x20) ++i_;
      out.append(t_, plain, i_ - plain);
      if (i_ >= t_.size()) fail("an unterminated string");
      const unsigned char c = static_cast<unsigned char>(t_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("a control character in a string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (i_ >= t_.size()) fail("an unterminated string");
      const char e = t_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (t_.compare(i_, 2, "\\u") != 0) fail("a lone surrogate");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("a lone surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("a lone surrogate");
          }
          utf8(out, cp);
          break;
        }
        default: fail("a bad escape");
      }
    }
  }

  const std::string& t_;
  const std::string& where_;
  size_t i_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

JsonValue parse_json(const std::string& text, const std::string& where) {
  return Reader(text, where).document();
}

TextPosition json_position(const std::string& text, size_t offset) {
  TextPosition p;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i)
    if (text[i] == '\n') ++p.line, line_start = i + 1;
  p.column = offset - line_start + 1;
  return p;
}

}  // namespace strata
