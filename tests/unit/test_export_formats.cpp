// The pieces of strata export and train.init_from (docs/checkpoints.md, "Export and import"):
// the strict JSON reader, safetensors written and read back, bf16 and f16 conversions, the
// Conv1D transpose and the vocabulary rule. The files end to end: tests/checkpoint/export_import.py.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <fstream>
#include <sstream>

#include "base/json.h"
#include "checkpoint/gpt2_layout.h"
#include "checkpoint/safetensors.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using strata::test::user_error;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Runs f, which must throw UserError(kExitBadCheckpoint) with a one-line message; returns it.
std::string file_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const strata::UserError& e) {
    CHECK(e.code == strata::kExitBadCheckpoint);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return e.what();
  }
  FAIL("expected UserError, nothing was thrown");
  return "";
}

}  // namespace

TEST_CASE("json: values, escapes and what RFC 8259 refuses", "[export]") {
  const auto v = strata::parse_json(
      R"({"a": [1, -2, 3.5e1], "s": "\u0120t\n\ud83d\ude00", "t": true, "n": null, "o": {}})", "x");
  REQUIRE(v.is_object());
  REQUIRE(v.find("a")->items.size() == 3);
  CHECK(v.find("a")->items[1].is_int());
  CHECK(v.find("a")->items[1].int_value == -2);
  CHECK(!v.find("a")->items[2].is_int());
  CHECK(v.find("a")->items[2].number == 35.0);
  CHECK(v.find("s")->text == "\xc4\xa0t\n\xf0\x9f\x98\x80");  // U+0120, U+1F600 as UTF-8
  CHECK(v.find("t")->boolean);
  CHECK(v.find("missing") == nullptr);
  // Where each value (and an object member's key) starts, for messages.
  const std::string text = "{\"a\": 1,\n  \"b\": [true, \"x\"]}";
  const auto w = strata::parse_json(text, "x");
  CHECK(w.offset == 0);
  CHECK(w.find("a")->key_offset == 1);
  CHECK(w.find("a")->offset == 6);
  CHECK(w.find("b")->key_offset == 11);
  CHECK(w.find("b")->items[1].offset == 23);
  CHECK(strata::json_position(text, 11).line == 2);
  CHECK(strata::json_position(text, 11).column == 3);
  CHECK(strata::json_position(text, 0).column == 1);
  CHECK_THAT(user_error([] { strata::parse_json(R"({"k": 1, "k": 2})", "h"); }),
             Contains("h: bad JSON at line 1, column 10 (byte 9): duplicate key \"k\""));
  CHECK_THAT(user_error([] { strata::parse_json("{\n \"k\": 1,\n \"j\": 2,\n \"k\": 3}", "h"); }),
             Contains("h: bad JSON at line 4, column 2 (byte 21): duplicate key \"k\""));
  CHECK_THAT(user_error([] { strata::parse_json("[1,\n  2,]", "h"); }),
             Contains("h: bad JSON at line 2, column 5 (byte 8): expected a value"));
  CHECK_THAT(user_error([] { strata::parse_json("[1", "h"); }), Contains("unexpected end; expected ']'"));
  CHECK_THAT(user_error([] { strata::parse_json("[01]", "h"); }), Contains("leading zero"));
  CHECK_THAT(user_error([] { strata::parse_json("{} x", "h"); }), Contains("text after the JSON value"));
  CHECK_THAT(user_error([] { strata::parse_json("\"\\ud800\"", "h"); }), Contains("lone surrogate"));
  CHECK_THAT(user_error([] { strata::parse_json(std::string(100, '['), "h"); }), Contains("nested too deeply"));
}

TEST_CASE("safetensors: written per the format and read back", "[export]") {
  strata::test::TempDir dir;
  const std::string path = (dir.path / "t.safetensors").string();
  const float a[6] = {1, 2, 3, 4, 5, 6};
  std::vector<strata::SafeTensor> ts = {
      {.name = "a", .dtype = "F32", .shape = {2, 3}, .bytes = strata::encode_floats(a, 6, "F32")},
      {.name = "empty", .dtype = "F32", .shape = {0, 3}, .bytes = ""},
      {.name = "b", .dtype = "BF16", .shape = {3}, .bytes = strata::encode_floats(a, 3, "BF16")}};
  strata::write_safetensors(path, ts, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  std::stringstream raw;
  raw << in.rdbuf();
  const std::string blob = raw.str();
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  CHECK((8 + n) % 8 == 0);
  CHECK(blob[8] == '{');
  CHECK(blob.size() == 8 + n + 24 + 6);
  CHECK_THAT(blob.substr(8, n), Contains(R"("__metadata__":{"format":"pt"})"));
  CHECK_THAT(blob.substr(8, n), Contains(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"));
  CHECK_THAT(blob.substr(8, n), Contains(R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]})"));
  const strata::SafeTensorsFile f = strata::read_safetensors(path);
  REQUIRE(f.tensors.size() == 3);
  CHECK(f.metadata.at("format") == "pt");
  CHECK(f.tensors[0].name == "a");
  CHECK(f.tensors[2].name == "b");  // offset order: the empty tensor [24, 24) sorts before b
  CHECK(strata::decode_floats(f.tensors[2].bytes, "BF16", "b") == std::vector<float>{1, 2, 3});
  CHECK(strata::decode_floats(f.tensors[0].bytes, "F32", "a") == std::vector<float>(a, a + 6));
}

TEST_CASE("bf16 rounds to nearest even, f16 widens exactly", "[export]") {
  CHECK(strata::bf16_round(1.0f) == 0x3F80);
  CHECK(strata::bf16_round(from_bits(0x3F808000u)) == 0x3F80);  // a tie: to the even 0x3F80
  CHECK(strata::bf16_round(from_bits(0x3F818000u)) == 0x3F82);  // a tie: to the even 0x3F82
  CHECK(strata::bf16_round(from_bits(0x3F808001u)) == 0x3F81);  // above the tie: up
  CHECK(strata::bf16_round(from_bits(0x7F7FFFFFu)) == 0x7F80);  // FLT_MAX rounds to infinity
  CHECK((strata::bf16_round(from_bits(0x7F800001u)) & 0x7F) != 0);  // NaN stays NaN
  const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7C00};  // 1, -2, 2^-24, +inf
  const auto v = strata::decode_floats(std::string(reinterpret_cast<const char*>(h), 8), "F16", "h");
  CHECK(v == std::vector<float>{1.f, -2.f, 5.9604644775390625e-8f, INFINITY});
  CHECK_THAT(file_error([] { strata::decode_floats("abcd", "I32", "f: tensor t"); }),
             Contains("f: tensor t: dtype I32 is not a floating-point type strata reads"));
}

TEST_CASE("GPT-2's names, the Conv1D transpose and the vocabulary rule", "[export]") {
  const strata::GptDims d{.V = 300, .Vp = 300, .T = 16, .L = 2, .NH = 2, .C = 8, .dropout = 0};
  const auto ts = strata::gpt_tensors(d);
  REQUIRE(ts.size() == 2 + 12 * 2 + 2);
  CHECK(ts[4].hf == "h.0.attn.c_attn.weight");
  CHECK(ts[4].strata == "block1.attn.c_attn.weight");
  CHECK(strata::hf_shape(ts[4]) == strata::Shape{8, 24});  // in x out
  CHECK(ts.back().hf == "ln_f.bias");
  const float m[6] = {1, 2, 3, 4, 5, 6};  // 2 x 3
  CHECK(strata::transposed(m, 2, 3) == std::vector<float>{1, 4, 2, 5, 3, 6});
  strata::GptDims padded = d;
  padded.Vp = 384;
  strata::check_vocab(300, d, "f", "wte");
  strata::check_vocab(300, padded, "f", "wte");  // the model's table is 300 padded to 384
  CHECK_THAT(file_error([&] { strata::check_vocab(256, d, "f", "wte.weight"); }),
             Contains("f: wte.weight holds a vocabulary of 256 tokens; the model's token table has 300 rows"));
  CHECK_THAT(file_error([&] { strata::check_vocab(200, padded, "f", "wte"); }), Contains("has 384 rows"));
}
