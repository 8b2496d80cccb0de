// A strict JSON reader for the small JSON files strata reads from other tools (a safetensors
// header, Hugging Face's config.json and shard index). RFC 8259 only: no comments, no trailing
// commas, no NaN; a duplicate key in an object is an error (safetensors forbids them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  bool integer = false;  // a number written without fraction or exponent...
  int64_t int_value = 0;  // ...that fits int64: its exact value
  std::string text;       // string
  std::vector<JsonValue> items;                            // array
  std::vector<std::pair<std::string, JsonValue>> members;  // object, in the text's order
  // Byte offsets into the parsed text, for messages (json_position): where this value starts
  // and, for an object member's value, where its key starts.
  size_t offset = 0, key_offset = 0;

  bool is_object() const { return kind == Kind::kObject; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_int() const { return kind == Kind::kNumber && integer; }
  // The member `key` of an object, or null.
  const JsonValue* find(const std::string& key) const;
};

// Parses `text`; on malformed JSON throws UserError(kExitBadInput)
// "WHERE: bad JSON at line L, column C (byte N): ...".
JsonValue parse_json(const std::string& text, const std::string& where);

// The 1-based line and column (in bytes) of byte `offset` of `text`.
struct TextPosition {
  size_t line = 1, column = 1;
};
TextPosition json_position(const std::string& text, size_t offset);

}  // namespace strata
