// Config keys: strict numbers, TOML types, unknown and duplicate keys, and the effective config
// that reads back to the same RunConfig.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "base/parse.h"
#include "config/config.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using strata::RunConfig;
using strata::test::user_error;

namespace {

RunConfig from_toml(const std::string& text) {
  RunConfig c;
  strata::read_config_text(text, "t.toml", c);
  return c;
}
std::string toml_error(const std::string& text) {
  return user_error([&] { from_toml(text); });
}
std::string flag_error(const std::string& key, std::vector<std::string> values) {
  RunConfig c;
  return user_error([&] {
    for (const auto& k : strata::config_keys(c))
      if (k.name == key) k.set_from_flag(values);
  });
}

}  // namespace

TEST_CASE("numbers are parsed strictly", "[config]") {
  std::string why;
  CHECK(strata::parse_int("42", &why) == 42);
  CHECK(strata::parse_int("-7", &why) == -7);
  for (const char* bad : {"", "1e3", "0x10", "12abc", " 1", "1.0", "99999999999999999999"})
    CHECK_FALSE(strata::parse_int(bad, &why).has_value());
  CHECK(strata::parse_real("0.05", &why) == 0.05);
  CHECK(strata::parse_real("+1e-3", &why) == 1e-3);
  for (const char* bad : {"", "nan", "inf", "-inf", "1e400", "0.1x", "--1"})
    CHECK_FALSE(strata::parse_real(bad, &why).has_value());
}

TEST_CASE("flags: NaN, infinity, overflow and junk are refused, naming the flag", "[config]") {
  CHECK_THAT(flag_error("train.momentum", {"nan"}), Contains("flag --train.momentum: must be a finite number"));
  CHECK_THAT(flag_error("train.lr", {"1e39"}), Contains("32-bit float"));
  CHECK_THAT(flag_error("train.lr", {"1e400"}), Contains("out of range"));
  CHECK_THAT(flag_error("train.grad_clip", {"inf"}), Contains("finite"));
  CHECK_THAT(flag_error("train.epochs", {"1e10"}), Contains("expected an integer, got '1e10'"));
  CHECK_THAT(flag_error("train.batch_size", {"99999999999999999999"}), Contains("out of range"));
  CHECK_THAT(flag_error("model.heads", {"3000000000"}), Contains("must be in [1, 16777216]"));
  CHECK_THAT(flag_error("train.warmup_steps", {"-1"}), Contains("must be >= 0"));
  CHECK_THAT(flag_error("train.nesterov", {"yes"}), Contains("expected true or false"));
  CHECK_THAT(flag_error("model.hidden", {"256", "-1"}), Contains("element 2: must be in"));
  CHECK_THAT(flag_error("model.type", {"rnn"}), Contains("expected one of mlp, cnn, custom, gpt"));
  CHECK_THAT(flag_error("data.path", {"a\nb"}), Contains("control character"));
}

TEST_CASE("config files: every value has its TOML type", "[config]") {
  CHECK(from_toml("[train]\nbatch_size = 32\nlr = 1\n").train.batch_size == 32);
  CHECK(from_toml("[train]\nlr = 1\n").train.lr == 1.0);  // an integer for a number key
  CHECK_THAT(toml_error("[train]\nbatch_size = \"32\"\n"),
             Contains("t.toml:2:14: key train.batch_size: expected an integer >= 1, got a string"));
  CHECK_THAT(toml_error("[train]\nbatch_size = [32]\n"), Contains("got an array"));
  CHECK_THAT(toml_error("[train]\nepochs = 3.0\n"), Contains("got a float"));
  CHECK_THAT(toml_error("[train]\nnesterov = \"yes\"\n"), Contains("expected true or false"));
  CHECK_THAT(toml_error("[train]\nlr = nan\n"), Contains("finite"));
  CHECK_THAT(toml_error("[train]\nlr = inf\n"), Contains("finite"));
  CHECK_THAT(toml_error("[model]\nhidden = [\"256\"]\n"), Contains("got an array holding a string"));
  CHECK_THAT(toml_error("[train]\nlr = { x = 1 }\n"), Contains("got a table"));
}

TEST_CASE("config files: data.path is a string or a list of strings, kept as its TOML text", "[config]") {
  const RunConfig one = from_toml("[data]\npath = \"shards/*_train_*.bin\"\n");
  CHECK(one.data.path == "shards/*_train_*.bin");
  const RunConfig list = from_toml("[data]\npath = [\"a.bin\", 'dir/b \"q\".bin']\n");
  CHECK(list.data.path == "[\"a.bin\", \"dir/b \\\"q\\\".bin\"]");
  CHECK(strata::toml_array_values(list.data.path, "data.path") ==
        std::vector<std::string>{"a.bin", "dir/b \"q\".bin"});
  CHECK(from_toml(list.to_toml()).data.path == list.data.path);  // the effective config reads back
  CHECK_THAT(toml_error("[data]\npath = [\"a.bin\", 3]\n"),
             Contains("expected a string or a list of strings, got an array holding an integer"));
  CHECK_THAT(toml_error("[data]\nformat = \"parquet\"\n"), Contains("expected one of auto, hdf5, llmc, nanogpt"));
}

TEST_CASE("config files: unknown, misplaced and duplicate keys are errors", "[config]") {
  CHECK_THAT(toml_error("[train]\nepoch = 3\n"),
             Contains("t.toml:2:1: unknown key 'train.epoch' (did you mean 'train.epochs'?)"));
  CHECK_THAT(toml_error("epochs = 3\n"), Contains("keys belong in a [section]"));
  CHECK_THAT(toml_error("[train]\nepochs = 3\nepochs = 4\n"), Contains("t.toml:3"));
  CHECK_THAT(toml_error("[train.sub]\nx = 1\n"), Contains("unknown key 'train.sub'"));
  CHECK_THAT(toml_error("[trian]\n"), Contains("t.toml:1:2: unknown section [trian]"));
  std::string deep = "[train";
  for (int i = 0; i < 500; ++i) deep += ".x";
  CHECK_THAT(toml_error(deep + "]\ny = 1\n"), Contains("unknown key 'train.x'"));
  std::string nested = "[train]\nx = ";
  for (int i = 0; i < 600; ++i) nested += "[";
  CHECK_THAT(toml_error(nested), Contains("not valid TOML"));
  CHECK_THAT(toml_error("[train\n"), Contains("not valid TOML"));
  CHECK_THAT(toml_error("[data]\npath = \"\xff\"\n"), Contains("not valid TOML"));
}

TEST_CASE("config files: non-ASCII only in strings and comments", "[config]") {
  // U+048F: a code point toml++ 3.3 mishandles where it tests for whitespace (found by fuzzing).
  const std::string c = "\xd2\x8f";
  CHECK(from_toml("# " + c + "\n[data]\npath = \"d" + c + ".h5\"  # " + c + "\n").data.path == "d" + c + ".h5");
  CHECK(from_toml("[data]\npath = 'd" + c + ".h5'\n").data.path == "d" + c + ".h5");
  CHECK_THAT(toml_error("[train]\nepochs = 3" + c + "\n"), Contains("t.toml:2:11: a non-ASCII character outside"));
  CHECK_THAT(toml_error("[train" + c + "]\n"), Contains("non-ASCII character outside a string"));
  CHECK_THAT(toml_error("[data]\npath = \"\"\"\\\n" + c + "\"\"\"\n"), Contains("multi-line string"));
  // A quote that cannot open a string there does not hide what follows (fuzzing found it).
  CHECK_THAT(toml_error("[train]\nlr = -0'." + c + "'\n"), Contains("non-ASCII character outside"));
}

TEST_CASE("the effective config reads back to the same config", "[config]") {
  RunConfig c;
  c.model.type = "gpt";
  c.model.layers = {"6"};
  c.model.dropout = 0.1f;
  c.train.lr = 3e-4;
  c.train.eps = 1e-8;
  c.parallel.stage_layers = {};
  c.data.path = "dir with \"quotes\" and \\ backslash.h5";
  const std::string text = c.to_toml();
  CHECK_THAT(text, Contains("layers = 6\n"));
  CHECK_THAT(text, Contains("dropout = 0.1\n"));
  CHECK_THAT(text, Contains("stage_layers = []\n"));
  RunConfig back = from_toml(text);
  CHECK(back.to_toml() == text);
  CHECK(back.model.layers == c.model.layers);
  CHECK(back.model.dropout == c.model.dropout);
  CHECK(back.data.path == c.data.path);

  RunConfig custom;
  custom.model.type = "custom";
  custom.model.layers = {"conv 8 3 1 1", "relu", "flatten", "linear 10"};
  CHECK(from_toml(custom.to_toml()).model.layers == custom.model.layers);
}

TEST_CASE("every key of the list is in docs/configuration.md's table", "[config]") {
  RunConfig c;
  // The first cell of the table's rows only ("| `key`, `key` | default | meaning |"): a key
  // named in another row's meaning or elsewhere on the page does not count.
  std::istringstream page(strata::test::read_file(STRATA_SOURCE_DIR "/docs/configuration.md"));
  std::string first_cells;
  for (std::string line; std::getline(page, line);)
    if (line.rfind("| `", 0) == 0) first_cells += line.substr(0, line.find('|', 1)) + "\n";
  for (const auto& k : strata::config_keys(c)) {
    INFO(k.name);
    CHECK_THAT(first_cells, Contains("`" + k.name + "`"));
  }
}
