// GPT-2's tokenizer (src/data/gpt2_tokenizer.h) on a small vocabulary written here: the
// pre-tokeniser's splits, the merges, threads against one thread, and every fault of the
// vocabulary files. (Against GPT-2's own vocabulary and an implementation we did not write:
// tests/tokenizer/gpt2_vs_reference.py.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/gpt2_tokenizer.h"
#include "strata/error.h"

namespace fs = std::filesystem;
using strata::Gpt2Tokenizer;

namespace {

std::vector<std::string> pretokens(const std::string& text) {
  std::vector<std::string> out;
  strata::gpt2_pretokenize(text, [&](size_t start, size_t len) { out.push_back(text.substr(start, len)); });
  return out;
}

// GPT-2's spelling of a byte (bytes_to_unicode): a code point.
int spelling(unsigned char b) {
  int n = 0;
  for (int c = 0; c < 256; ++c) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    if (c == b) return printable ? c : 256 + n;
    if (!printable) ++n;
  }
  return -1;
}

// s spelled for encoder.json (\u escapes) or vocab.bpe (UTF-8).
std::string json_spelled(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += fmt::format("\\u{:04x}", spelling(c));
  return out;
}
std::string bpe_spelled(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    const int cp = spelling(c);
    if (cp < 0x80) out += char(cp);
    else out += char(0xC0 | cp >> 6), out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

using Merges = std::vector<std::pair<std::string, std::string>>;

// A vocabulary in dir: the 256 bytes (ids 0..255), then one token per merge, in order.
fs::path make_vocab(const std::string& name, const Merges& merges) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("strata-gpt2-{}-{}", name, ::getpid());
  fs::create_directories(dir);
  std::string json = "{";
  for (int b = 0; b < 256; ++b) json += fmt::format("{}\"{}\": {}", b ? ", " : "", json_spelled(std::string(1, char(b))), b);
  std::string bpe = "#version: 0.2\n";
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    json += fmt::format(", \"{}\": {}", json_spelled(left + right), 256 + i);
    bpe += bpe_spelled(left) + " " + bpe_spelled(right) + "\n";
  }
  write_file(dir / "encoder.json", json + "}\n");
  write_file(dir / "vocab.bpe", bpe);
  return dir;
}

// ids 256..264: ll he hell hello " w" " wo" rl " worl" " world"
const Merges kMerges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"},
                        {" w", "o"}, {"r", "l"}, {" wo", "rl"}, {" worl", "d"}};

std::string load_error(const fs::path& dir) {
  try {
    Gpt2Tokenizer::load(dir.string());
  } catch (const strata::UserError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("gpt2 pre-tokeniser splits as GPT-2's pattern does", "[gpt2]") {
  using V = std::vector<std::string>;
  CHECK(pretokens("Hello world") == V{"Hello", " world"});
  CHECK(pretokens("don't stop") == V{"don", "'t", " stop"});
  CHECK(pretokens("'s'S'll'LL") == V{"'s", "'", "S", "'ll", "'", "LL"});  // contractions are lower case
  CHECK(pretokens("x   y") == V{"x", "  ", " y"});           // a run leaves its last space to the word
  CHECK(pretokens("x\n\ny") == V{"x", "\n", "\n", "y"});     // ... even when that is not a space
  CHECK(pretokens("x \n y  ") == V{"x", " \n", " y", "  "});  // at the end, the whole run
  CHECK(pretokens("abc123 456!?.. x") == V{"abc", "123", " 456", "!?..", " x"});
  CHECK(pretokens(" \xe2\x82\xac\xf0\x9f\x98\x80!") == V{" \xe2\x82\xac\xf0\x9f\x98\x80!"});  // " €😀!": other
  CHECK(pretokens("\xce\xb1\xce\xb2 \xd9\xa3\xd9\xa4") == V{"\xce\xb1\xce\xb2", " \xd9\xa3\xd9\xa4"});  // αβ ٣٤
  CHECK(pretokens("a\xe3\x80\x80\xe3\x80\x80" "b") == V{"a", "\xe3\x80\x80", "\xe3\x80\x80", "b"});  // U+3000 x2
  // Not UTF-8: each such byte is one character of the class "other".
  CHECK(pretokens("ab\xff\xfe" "cd \x80") == V{"ab", "\xff\xfe", "cd", " \x80"});
  CHECK(pretokens("\xe2\x82" "a") == V{"\xe2\x82", "a"});  // a truncated sequence
  CHECK(pretokens("").empty());
}

TEST_CASE("gpt2 merges by rank, decodes back, and threads give one thread's ids", "[gpt2]") {
  const fs::path dir = make_vocab("ok", kMerges);
  const Gpt2Tokenizer t = Gpt2Tokenizer::load(dir.string());
  CHECK(t.vocab_size() == 256 + int(kMerges.size()));
  CHECK(t.encode("hello world") == std::vector<int32_t>{259, 264});
  CHECK(t.encode("hellohello") == std::vector<int32_t>{259, 259});  // each merge everywhere, in rank order
  // 100 bytes in one word: the heap's path, same ranks.
  std::string ls(101, 'l');
  std::vector<int32_t> want(50, 256);
  want.push_back('l');
  CHECK(t.encode(ls) == want);

  // A megabyte of lines of words, spaces and newlines, cut into pieces on 2..5 threads.
  std::mt19937 rng(7);
  const char* parts[] = {"hello", " world", "\n", "\n\n", "  ", " ", "x", "!", "\t", "l", "\xc3\xa9", "\n  ", "'s"};
  std::string text;
  while (text.size() < (1u << 20)) text += parts[rng() % std::size(parts)];
  const std::vector<int32_t> one = t.encode(text);
  CHECK(t.decode(one) == text);
  for (int threads = 2; threads <= 5; ++threads) {
    size_t last = 0, calls = 0;
    CHECK(t.encode_parallel(text, threads, [&](size_t done) { last = done, ++calls; }) == one);
    CHECK(last == text.size());
  }
  fs::remove_all(dir);
}

TEST_CASE("gpt2 vocabulary faults name the file and line", "[gpt2]") {
  CHECK_THAT(load_error("/no/such/vocab"), Catch::Contains("/no/such/vocab: does not exist"));
  const fs::path dir = make_vocab("bad", kMerges);
  const std::string json = (dir / "encoder.json").string(), bpe = (dir / "vocab.bpe").string();
  const std::string good_json = [&] { std::ifstream f(json); return std::string(std::istreambuf_iterator<char>(f), {}); }();

  write_file(dir / "vocab.bpe", "#version: 0.2\nl l\nh e\nq z\n");
  CHECK_THAT(load_error(dir), Catch::Contains(bpe + ": line 4: the merge \"q z\" names the merged token \"qz\", which is not in " + json));
  write_file(dir / "vocab.bpe", "#version: 0.2\nl l\nl l\n");
  CHECK_THAT(load_error(dir), Catch::Contains(bpe + ": line 3: the merge \"l l\" repeats line 2"));
  write_file(dir / "vocab.bpe", "#version: 0.2\nl l x\n");
  CHECK_THAT(load_error(dir), Catch::Contains(bpe + ": line 2: \"l l x\" is not a merge"));
  write_file(dir / "vocab.bpe", "#version: 0.2\n\xe2\x82\xac l\n");  // €: not a byte's spelling
  CHECK_THAT(load_error(dir), Catch::Contains(bpe + ": line 2: the merge"));

  write_file(dir / "vocab.bpe", "#version: 0.2\nl l\n");
  write_file(dir / "encoder.json", "{\"a\": 0,\n \"b\" 1}");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": bad JSON at line 2, column 6 (byte 14): expected ':'"));
  write_file(dir / "encoder.json", good_json.substr(0, good_json.size() - 2) + ", \"zz\": 256}");  // id 256 again
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": line 1, column") && Catch::Contains("has id 256, which the token"));
  write_file(dir / "encoder.json", "{\"a\": 0, \"a\": 1}");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": bad JSON at line 1, column 10 (byte 9): duplicate key \"a\""));
  write_file(dir / "encoder.json", "{\"a\": 0, \"b\": 2}");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": no token has id 1"));
  write_file(dir / "encoder.json", "{\"a\": 0, \"b\": 1}");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": has no token for the byte 0x00"));
  write_file(dir / "encoder.json", "{\"a\": 0.5}");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": line 1, column 2: token \"a\" has an id that is not a non-negative integer"));
  write_file(dir / "encoder.json", "{\"a\": 0");
  CHECK_THAT(load_error(dir), Catch::Contains("unexpected end; expected '}'"));
  write_file(dir / "encoder.json", "[0]");
  CHECK_THAT(load_error(dir), Catch::Contains(json + ": line 1, column 1: expected '{' (a JSON object of token -> id)"));

  // Hugging Face's names, when OpenAI's are absent.
  fs::remove(dir / "encoder.json");
  fs::remove(dir / "vocab.bpe");
  write_file(dir / "vocab.json", good_json);
  write_file(dir / "merges.txt", "#version: 0.2\nl l\nh e\n");
  CHECK(Gpt2Tokenizer::load(dir.string()).encode("hell") == std::vector<int32_t>{257, 256});
  fs::remove_all(dir);
}
