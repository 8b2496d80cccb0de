// TOML config files, read with toml++ (a TOML 1.0 parser: typed values, duplicate keys and
// syntax errors found with their line and column, nesting bounded) and checked key by key
// against config_keys().
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "config/config.h"
#include "strata/error.h"

namespace strata {
namespace {

constexpr int64_t kMaxConfigBytes = 1 << 20;  // a config is a page of text, not a data file

std::string at(const std::string& source, const toml::source_region& r) {
  return r.begin.line ? fmt::format("config {}:{}:{}", source, r.begin.line, r.begin.column)
                      : fmt::format("config {}", source);
}

std::string node_kind(const toml::node& v) {
  switch (v.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return fmt::format("a string (\"{}\")", *v.value<std::string>());
    case toml::node_type::integer: return fmt::format("an integer ({})", *v.value<int64_t>());
    case toml::node_type::floating_point: return fmt::format("a float ({})", *v.value<double>());
    case toml::node_type::boolean: return *v.value<bool>() ? "true" : "false";
    default: return "a date or time";
  }
}

// One `key = value` of the file into its field; the value's TOML type must be the key's.
void set_key(const ConfigKey& k, const toml::node& v, const std::string& where) {
  auto wrong = [&] { fail_input("{}: expected {}, got {}", where, k.expects(), node_kind(v)); };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) wrong();
          k.set_bool(*v.value<bool>(), where);
        } else if constexpr (std::is_integral_v<T>) {
          if (!v.is_integer()) wrong();
          k.set_int(*v.value<int64_t>(), where);
        } else if constexpr (std::is_floating_point_v<T>) {
          // A float key takes an integer too ("lr = 1"): TOML writes 1.0 and 1 differently.
          if (v.is_integer()) k.set_int(*v.value<int64_t>(), where);
          else if (v.is_floating_point())
            k.set_real(*v.value<double>(), fmt::format("{}", *v.value<double>()), where);
          else wrong();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (k.list_as_text && v.is_array()) {
            std::vector<std::string> sv;
            for (const toml::node& e : *v.as_array()) {
              if (!e.is_string())
                fail_input("{}: expected {}, got an array holding {}", where, k.expects(), node_kind(e));
              sv.push_back(*e.value<std::string>());
            }
            return k.set_text_list(sv, where);
          }
          if (!v.is_string()) wrong();
          k.set_text(*v.value<std::string>(), where);
        } else {
          if (k.count_or_list && v.is_integer()) return k.set_int(*v.value<int64_t>(), where);
          const toml::array* a = v.as_array();
          if (!a) wrong();
          constexpr bool ints = std::is_same_v<T, std::vector<int>>;
          std::vector<int64_t> iv;
          std::vector<std::string> sv;
          for (const toml::node& e : *a) {
            if (ints ? !e.is_integer() : !e.is_string())
              fail_input("{}: expected {}, got an array holding {}", where, k.expects(), node_kind(e));
            if constexpr (ints) iv.push_back(*e.value<int64_t>());
            else sv.push_back(*e.value<std::string>());
          }
          if constexpr (ints) k.set_int_list(iv, where);
          else k.set_text_list(sv, where);
        }
      },
      k.field);
}

// toml++ 3.3 (Debian's) reaches __builtin_unreachable on some non-ASCII code points where it
// tests for whitespace: outside strings and comments, and after a line-ending backslash in a
// multi-line basic string (tomlplusplus issues #190 and #295; fixed upstream in 2026, found
// here by tests/fuzz). TOML allows non-ASCII text only in strings and comments; strata reads
// it there, except in multi-line basic strings, which no strata key needs.
void refuse_what_tomlpp_mishandles(std::string_view text, const std::string& source) {
  enum { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } state = kCode;
  int line = 1, column = 0;
  // A quote opens a string only where a key or value can begin: first on its line, or after
  // = [ { , or . (elsewhere, as in `lr = -0'x`, toml++ reads it as part of a bad value).
  char before = '\n';
  auto starts = [&](size_t i, const char* three) { return text.compare(i, 3, three) == 0; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ++column;
    if (c == '\n') {
      ++line, column = 0;
      if (state != kMultiBasic && state != kMultiLiteral) state = kCode, before = '\n';
      continue;
    }
    const bool ascii = static_cast<unsigned char>(c) < 0x80;
    switch (state) {
      case kCode: {
        if (!ascii)
          fail_input("config {}:{}:{}: a non-ASCII character outside a string or comment (TOML "
                     "allows them only there)", source, line, column);
        const bool opens = std::string_view("\n=[{,.").find(before) != std::string_view::npos;
        if (c == '#') state = kComment;
        else if (c == '"' && opens) state = starts(i, "\"\"\"") ? (i += 2, kMultiBasic) : kBasic;
        else if (c == '\'' && opens) state = starts(i, "'''") ? (i += 2, kMultiLiteral) : kLiteral;
        if (c != ' ' && c != '\t' && c != '\r') before = c;
        break;
      }
      case kComment: break;
      case kBasic:
        if (c == '\\') ++i;
        else if (c == '"') state = kCode, before = '"';
        break;
      case kLiteral:
        if (c == '\'') state = kCode, before = '\'';
        break;
      case kMultiBasic:
        if (!ascii)
          fail_input("config {}:{}:{}: non-ASCII text in a multi-line string (\"\"\"...\"\"\") is "
                     "not read; use a one-line string", source, line, column);
        if (c == '\\') ++i;
        else if (starts(i, "\"\"\"")) state = kCode, before = '"', i += 2;
        break;
      case kMultiLiteral:
        if (starts(i, "'''")) state = kCode, before = '\'', i += 2;
        break;
    }
  }
}

}  // namespace

std::vector<std::string> toml_array_values(const std::string& text, const std::string& where) {
  toml::table t;
  try {
    t = toml::parse("v = " + text);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    for (char& c : what)
      if (c == '\n') c = ' ';
    fail_input("{}: '{}' is not a TOML array: {}", where, text, what);
  }
  const toml::array* a = t["v"].as_array();
  if (!a || t.size() != 1) fail_input("{}: '{}' is not a TOML array", where, text);
  std::vector<std::string> out;
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::node& v = *a->get(i);
    if (auto s = v.value<std::string>(); s && v.is_string()) out.push_back(*s);
    else if (auto n = v.value<int64_t>(); n && v.is_integer()) out.push_back(std::to_string(*n));
    else fail_input("{}: element {} is {}; expected an integer or a string", where, i + 1, node_kind(v));
  }
  return out;
}

void read_config_text(std::string_view text, const std::string& source, RunConfig& cfg) {
  refuse_what_tomlpp_mishandles(text, source);
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    for (char& c : what)
      if (c == '\n') c = ' ';
    fail_input("{}: not valid TOML: {}", at(source, e.source()), what);
  }
  const auto keys = config_keys(cfg);
  for (auto&& [section, body] : root) {
    const std::string where = at(source, section.source());
    const toml::table* t = body.as_table();
    if (!t) {
      std::string near;
      find_config_key(keys, std::string(section.str()), &near);
      fail_input("{}: unknown key '{}' (keys belong in a [section]{})", where, section.str(),
                 near.empty() ? "" : fmt::format("; did you mean [{}] {}?", near.substr(0, near.find('.')),
                                                 near.substr(near.find('.') + 1)));
    }
    const std::string name_of_section(section.str());
    const bool known = std::any_of(keys.begin(), keys.end(), [&](const ConfigKey& k) {
      return k.section() == name_of_section;
    });
    if (!known)
      fail_input("{}: unknown section [{}]", at(source, section.source()), section.str());
    for (auto&& [name, v] : *t) {
      const std::string full = fmt::format("{}.{}", section.str(), name.str());
      std::string near;
      const ConfigKey* k = find_config_key(keys, full, &near);
      if (!k)
        fail_input("{}: unknown key '{}'{}", at(source, name.source()), full,
                   near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near));
      set_key(*k, v, fmt::format("{}: key {}", at(source, v.source()), full));
      cfg.given[full] = at(source, v.source());
    }
  }
  apply_model_preset(cfg);
}

void read_config_file(const std::string& path, RunConfig& cfg) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    fail_input("config {}: cannot open ({})", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_input("config {}: not a regular file", path);
  if (st.st_size > kMaxConfigBytes)
    fail_input("config {}: {} bytes is too large for a config file (at most {})", path,
               int64_t(st.st_size), kMaxConfigBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input("config {}: cannot open ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  read_config_text(text.str(), path, cfg);
}

std::string RunConfig::to_toml() const {
  RunConfig copy = *this;
  // gpt: model.layers is the block count, written as the integer a config file holds.
  auto keys = config_keys(copy);
  std::string out, section;
  for (const ConfigKey& k : keys) {
    if (k.section() != section) {
      section = k.section();
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    std::string value = k.to_toml();
    std::string why;
    if (k.count_or_list && model.type == "gpt" && model.layers.size() == 1 &&
        parse_int(model.layers[0], &why))
      value = model.layers[0];
    out += fmt::format("{} = {}\n", k.key(), value);
  }
  return out;
}

}  // namespace strata
