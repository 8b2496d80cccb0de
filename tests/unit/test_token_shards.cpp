// Token shards: the token stream over several files, ranged reads across their boundaries, the
// validation split found beside the train shards, and the one-line errors.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "data/data.h"
#include "data/token_shards.h"
#include "data/token_source.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using strata::test::TempDir;
using strata::test::user_error;

namespace {

void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = int32_t(tokens.size());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
}

std::vector<uint16_t> iota_tokens(size_t n, uint16_t first) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace

TEST_CASE("token shards: one stream in file order, read across boundaries", "[data][shards]") {
  TempDir d;
  const std::string dir = d.path.string();
  // 5, 1 and 7 tokens: ids 0..12 across three files (sorted by name, not written order).
  write_llmc(dir + "/x_train_2.bin", iota_tokens(7, 6));
  write_llmc(dir + "/x_train_0.bin", iota_tokens(5, 0));
  write_llmc(dir + "/x_train_1.bin", iota_tokens(1, 5));
  write_llmc(dir + "/x_val_0.bin", iota_tokens(4, 100));
  strata::DatasetInfo info = strata::open_dataset(dir + "/x_train_*.bin");
  CHECK(info.format == "llmc");
  CHECK(info.vocab == 50257);
  CHECK(info.train.tokens == 13);
  REQUIRE(info.has_test);  // x_val_*.bin beside x_train_*.bin
  CHECK(info.test.files == std::vector<std::string>{dir + "/x_val_0.bin"});
  auto src = strata::open_token_source(info, info.train);
  std::vector<uint16_t> got(9);
  // [3, 8) spans all three files; [10, 13) is the last file's tail; [0, 1) the first token.
  src->read({{3, 8}, {10, 13}, {0, 1}}, reinterpret_cast<unsigned char*>(got.data()));
  CHECK(got == std::vector<uint16_t>{3, 4, 5, 6, 7, 10, 11, 12, 0});
  CHECK(src->where(5) == dir + "/x_train_1.bin: token at byte 1024");
  CHECK(src->where(12) == dir + "/x_train_2.bin: token at byte 1036");

  // A TOML list in the order given, and data.val_path.
  info = strata::open_dataset(fmt::format("[\"{0}/x_train_2.bin\", \"{0}/x_train_0.bin\"]", dir),
                              {.format = "auto", .val_path = dir + "/x_train_1.bin", .vocab = 20,
                               .check_part = 0, .check_parts = 1});
  CHECK(info.train.tokens == 12);
  CHECK(info.test.tokens == 1);
  CHECK(info.vocab == 20);
  src = strata::open_token_source(info, info.train);
  src->read({{5, 9}}, reinterpret_cast<unsigned char*>(got.data()));
  CHECK(std::vector<uint16_t>(got.begin(), got.begin() + 4) == std::vector<uint16_t>{11, 12, 0, 1});
}

TEST_CASE("token shards: the token check is split over parts", "[data][shards]") {
  TempDir d;
  const std::string file = (d.path / "a_train_0.bin").string();
  std::vector<uint16_t> t(3 << 19, 1);  // three chunks of the check (1 MiB each)
  t[(2 << 19) + 5] = 60000;             // in the third
  write_llmc(file, t);
  auto check = [&](int part, int parts) {
    return user_error([&] {
      strata::open_dataset(file, {.format = "auto", .val_path = "", .vocab = 0, .check_part = part,
                                  .check_parts = parts});
    });
  };
  const std::string bad = fmt::format("{}: token at byte {} = 60000 is out of range [0, 50257)", file,
                                      1024 + 2 * ((2 << 19) + 5));
  CHECK_THAT(check(0, 1), Contains(bad));
  CHECK_THAT(check(0, 2), Contains(bad));  // chunks 0 and 2
  // Part 1 of 2 checks chunk 1 only, which holds no bad token.
  CHECK(strata::open_dataset(file, {.format = "auto", .val_path = "", .vocab = 0, .check_part = 1,
                                    .check_parts = 2}).train.tokens == int64_t(t.size()));
}

TEST_CASE("token shards: a token changed after the check is named when a batch reads it", "[data][shards]") {
  TempDir d;
  const std::string file = (d.path / "a_train_0.bin").string();
  write_llmc(file, iota_tokens(41, 0));
  strata::DatasetInfo info = strata::open_dataset(file);
  strata::set_context(info, 4);  // 10 windows
  {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    const uint16_t bad = 60000;
    f.seekp(1024 + 2 * 17);
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  const char* was = std::getenv("STRATA_DATA_CACHE_MB");
  const std::string saved = was ? was : "";
  for (const char* cache : {"512", "0"}) {  // read whole into memory, and streamed
    INFO("STRATA_DATA_CACHE_MB=" << cache);
    ::setenv("STRATA_DATA_CACHE_MB", cache, 1);
    strata::Loader loader(info, "train", 10, 0, 1, /*shuffle=*/false, 1);
    CHECK_THAT(user_error([&] { loader.next(); }),
               Contains(file + ": token at byte 1058 = 60000 is out of range [0, 50257)"));
  }
  if (was) ::setenv("STRATA_DATA_CACHE_MB", saved.c_str(), 1);
  else ::unsetenv("STRATA_DATA_CACHE_MB");
}
